"""The sweep's plots, one code path for the sweep (from its outcomes) and the report (from
MLflow runs): `make_plots(rows, out_dir)` draws every plot whose axes the rows have.

A row is a plain dict describing one variant:
    {"name": "llama_decode_eager_cpu_ctx64", "model": "llama", "phase": "decode",
     "backend": "eager", "device": "cpu", "status": "ok", "unstable": False,
     "params": {"phase.context_len": "64", ...}, "metrics": {"latency_ms_median": 1.2, ...}}
Only rows with status "ok" and a median latency are drawn.

Plots (PNG, matplotlib's Agg backend, imported lazily so the driver starts fast):
    latency.png                  median latency per backend, one panel per model x phase
    plots/context_length.png     decode latency and tokens/s against phase.context_len
    plots/speedup_vs_eager.png   eager median / backend median, model x phase by backend
    plots/latency_vs_memory.png  median latency against peak memory
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

LATENCY = "latency.png"  # at the root of the sweep's run, as before
CONTEXT = "plots/context_length.png"
SPEEDUP = "plots/speedup_vs_eager.png"
MEMORY = "plots/latency_vs_memory.png"

MEDIAN, P90 = "latency_ms_median", "latency_ms_p90"
CI_LOW, CI_HIGH = "latency_ms_median_ci_low", "latency_ms_median_ci_high"
CONTEXT_LEN = "phase.context_len"
MEMORY_METRIC = {"cuda": ("cuda_peak_allocated_mb", "peak CUDA memory allocated")}
DEFAULT_MEMORY = ("peak_rss_mb", "peak resident memory (RSS)")
DPI = 110
PALETTE = ("C0", "C1", "C2", "C4", "C5", "C6", "C8", "C9")  # no red: red marks unstable


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok" and r.get("metrics", {}).get(MEDIAN) is not None]


def make_plots(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Every plot the rows have the axes for, written under out_dir (paths as above);
    returns the files written, latency.png first. Nothing measured: no files."""
    ok = measured(rows)
    if not ok:
        return []
    _matplotlib()
    out_dir = Path(out_dir)
    written = []
    for rel, draw in ((LATENCY, latency_plot), (CONTEXT, context_plot), (SPEEDUP, speedup_plot), (MEMORY, memory_plot)):
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if draw(ok, path):
            written.append(path)
    return written


# -- helpers ------------------------------------------------------------------------------
def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _base(r: dict[str, Any]) -> str:
    return f"{r['model']}_{r['phase']}_{r['backend']}_{r['device']}"


def suffix(r: dict[str, Any]) -> str:
    """What the name says beyond model, phase, backend and device (`ctx64_bf16`), or ''."""
    base = _base(r)
    return r["name"][len(base) :].lstrip("_") if r["name"].startswith(base) else ""


def _label(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _spans_decade(values: list[float]) -> bool:
    v = [x for x in values if x and x > 0]
    return bool(v) and max(v) / min(v) >= 10


def _log_axis(axis, values: list[float]) -> None:
    """A log axis with plain-number ticks (1, 2, 5, 10, ...), readable without exponents."""
    import matplotlib.ticker as mt

    if axis is axis.axes.xaxis:
        axis.axes.set_xscale("log")
    else:
        axis.axes.set_yscale("log")
    lo, hi = min(values), max(values)
    subs = (1.0, 2.0, 5.0) if hi / lo < 1000 else (1.0,)
    axis.set_major_locator(mt.LogLocator(subs=subs))
    axis.set_major_formatter(mt.FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(mt.NullFormatter())


def _pad_log_limits(set_lim, values: list[float], factor: float = 1.6) -> None:
    set_lim(min(values) / factor, max(values) * factor)


def _save(fig, path: Path) -> bool:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return True


# -- (a) latency per backend, one panel per model x phase ------------------------------------
def latency_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """One panel per model x phase, one line per variant (backend, device and what else its
    name says), median latency as a dot, its 95% CI as a thick bar, p90 as a thin whisker, on
    a log axis; unstable variants in red."""
    plt = _matplotlib()
    panels: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["model"], r["phase"], r["metrics"][MEDIAN])):
        panels[(r["model"], r["phase"])].append(r)
    keys = sorted(panels)
    ncols = 1 if len(keys) <= 2 else 2
    nrows = math.ceil(len(keys) / ncols)
    heights = [max(len(panels[k]) for k in keys[i * ncols : (i + 1) * ncols]) for i in range(nrows)]
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(7.5 * ncols, 0.42 * sum(heights) + 1.4 * nrows + 0.6),
        gridspec_kw={"height_ratios": [h + 1.8 for h in heights]},
        squeeze=False,
    )
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys, strict=False):
        group = panels[key]
        values = []
        for i, r in enumerate(group):
            m = r["metrics"]
            color = "tab:red" if r.get("unstable") else "tab:blue"
            med = m[MEDIAN]
            values.append(med)
            if m.get(P90) is not None:
                ax.plot([med, m[P90]], [i, i], color=color, lw=1, alpha=0.8)
                ax.plot([m[P90]], [i], marker="|", color=color, ms=9)
                values.append(m[P90])
            if m.get(CI_LOW) is not None and m.get(CI_HIGH) is not None:
                ax.plot([m[CI_LOW], m[CI_HIGH]], [i, i], color=color, lw=5, alpha=0.35, solid_capstyle="butt")
                values += [m[CI_LOW], m[CI_HIGH]]
            ax.plot([med], [i], "o", color=color, ms=6, zorder=3)
            note = f"{med:.3g} ms" + ("  unstable" if r.get("unstable") else "")
            ax.annotate(
                note,
                (max(med, m.get(P90) or med), i),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color=color,
            )
        labels = [_label(r["backend"], r["device"], suffix(r)) for r in group]
        ax.set_yticks(range(len(group)), labels, fontsize=9)
        ax.set_ylim(len(group) - 0.5, -0.5)
        _log_axis(ax.xaxis, values)
        ax.set_xlim(min(values) / 1.6, max(values) * 2.2)  # room for the value labels
        ax.grid(axis="x", which="major", alpha=0.3)
        ax.set_title(f"{key[0]} · {key[1]}", fontsize=11, loc="left")
        ax.set_xlabel("latency per call, ms (log)", fontsize=9)
    fig.suptitle(
        "Latency per backend — dot: median, thick bar: 95% CI of the median, whisker: p90; red: unstable",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(fig, path)


# -- (b) decode latency and tokens/s against context length -----------------------------------
def _context(r: dict[str, Any]) -> int | None:
    value = r.get("params", {}).get(CONTEXT_LEN)
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except (TypeError, ValueError):
        return None


def context_rows(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Variants with a context length (decode's: other phases normalise it away), by model,
    for the models measured at two context lengths or more."""
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if _context(r) is not None:
            by_model[r["model"]].append(r)
    return {m: rs for m, rs in sorted(by_model.items()) if len({_context(r) for r in rs}) >= 2}


def context_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """One row of panels per model: median decode latency (left) and tokens/s (right)
    against the context length, one line per backend (and device, and other varied axes)."""
    models = context_rows(rows)
    if not models:
        return False
    plt = _matplotlib()
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models) + 0.6), squeeze=False)
    for (model, rs), (ax_lat, ax_tok) in zip(models.items(), axes, strict=False):
        lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            rest = re.sub(r"(^|_)ctx\d+", "", suffix(r)).strip("_")
            lines[_label(r["backend"], r["device"], rest)].append(r)
        contexts = sorted({_context(r) for r in rs})
        unstable = False
        lat_values, tok_values = [], []
        for k, (label, pts) in enumerate(sorted(lines.items())):
            marker = "osD^v<>P"[k % 8]  # lines that coincide stay visible
            pts.sort(key=_context)
            x = [_context(r) for r in pts]
            lat = [r["metrics"][MEDIAN] for r in pts]
            lat_values += lat
            color = PALETTE[k % len(PALETTE)]
            ax_lat.plot(x, lat, marker=marker, ms=8 - k % 3, alpha=0.85, color=color, label=label)
            for xi, r in zip(x, pts, strict=False):
                if r.get("unstable"):  # a red ring
                    ax_lat.plot([xi], [r["metrics"][MEDIAN]], "o", ms=13, mfc="none", mec="tab:red", mew=1.5)
                    unstable = True
            tok = [(xi, r["metrics"].get("tokens_per_s")) for xi, r in zip(x, pts, strict=False)]
            tok = [(xi, t) for xi, t in tok if t is not None]
            if tok:
                ax_tok.plot(
                    [t[0] for t in tok],
                    [t[1] for t in tok],
                    marker=marker,
                    ms=8 - k % 3,
                    alpha=0.85,
                    color=color,
                    label=label,
                )
                tok_values += [t[1] for t in tok]
        for ax, values, ylabel, title in (
            (ax_lat, lat_values, "median latency per decode step, ms", "decode latency"),
            (ax_tok, tok_values, "tokens/s (whole batch)", "decode throughput"),
        ):
            ax.set_title(f"{model} · {title} vs context length", fontsize=11, loc="left")
            ax.set_xlabel("context length (tokens already in the KV cache)")
            ax.set_ylabel(ylabel)
            if contexts[-1] / contexts[0] >= 4:
                ax.set_xscale("log", base=2)
            ax.set_xticks(contexts, [str(c) for c in contexts])
            ax.xaxis.set_minor_locator(plt.NullLocator())
            if values and _spans_decade(values):
                _log_axis(ax.yaxis, values)
            elif values:
                ax.set_ylim(0, max(values) * 1.15)
            ax.grid(alpha=0.3)
            if values:
                handles, _ = ax.get_legend_handles_labels()
                if ax is ax_lat and unstable:
                    ring = Line2D([], [], ls="", marker="o", ms=11, mfc="none", mec="tab:red", label="unstable")
                    handles.append(ring)
                ax.legend(handles=handles, fontsize=8, title="backend", title_fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


# -- (c) speed-up over eager -----------------------------------------------------------------
def speedups(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], float]]:
    """(row labels, backends, {(row, backend): eager median / backend median}): a row is a
    model x phase (with device and other varied axes where they differ) that has an eager
    variant and at least one other backend on the same device with the same other axes."""
    groups: dict[tuple[str, str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        groups[(r["model"], r["phase"], r["device"], suffix(r))][r["backend"]] = r
    devices = {k[2] for k in groups}
    cells, labels, backends = {}, [], set()
    for (model, phase, device, rest), by_backend in sorted(groups.items()):
        eager = by_backend.get("eager")
        others = {b: r for b, r in by_backend.items() if b != "eager"}
        if eager is None or not others:
            continue
        label = _label(f"{model} · {phase}", device if len(devices) > 1 else "", rest)
        labels.append(label)
        for b, r in others.items():
            cells[(label, b)] = eager["metrics"][MEDIAN] / r["metrics"][MEDIAN]
            backends.add(b)
    return labels, sorted(backends), cells


def speedup_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    labels, backends, cells = speedups(rows)
    if not cells:
        return False
    import matplotlib.colors as mc
    import numpy as np

    plt = _matplotlib()
    grid = np.full((len(labels), len(backends)), np.nan)
    for (label, b), v in cells.items():
        grid[labels.index(label), backends.index(b)] = v
    extreme = max(2.0, *(max(v, 1 / v) for v in cells.values()))
    norm = mc.LogNorm(vmin=1 / extreme, vmax=extreme)  # 1x in the middle: slower red, faster green
    fig, ax = plt.subplots(figsize=(2.0 + 1.5 * len(backends) + 0.07 * max(map(len, labels)), 0.55 * len(labels) + 2.0))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(labels)):
        for j in range(len(backends)):
            v = grid[i, j]
            text = "–" if np.isnan(v) else f"{v:.3g}×"
            dark = not np.isnan(v) and abs(math.log(v)) > 0.7 * math.log(extreme)
            ax.text(j, i, text, ha="center", va="center", fontsize=10, color="white" if dark else "black")
    ax.set_xticks(range(len(backends)), backends)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("backend")
    ax.set_title(
        "Speed-up over eager (eager median latency / backend median latency)\n>1: faster than eager", fontsize=10
    )
    bar = fig.colorbar(image, ax=ax, shrink=0.9)
    steps = (0.01, 0.1, 1.0, 10.0, 100.0) if extreme >= 10 else (0.2, 0.5, 1.0, 2.0, 5.0)
    ticks = [t for t in steps if 1 / extreme <= t <= extreme]
    bar.set_ticks(ticks, labels=[f"{t:g}×" for t in ticks])
    bar.ax.minorticks_off()
    bar.set_label("speed-up over eager (log scale)")
    fig.tight_layout()
    return _save(fig, path)


# -- (d) latency against peak memory ---------------------------------------------------------
def memory_points(rows: list[dict[str, Any]]) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """{memory metric: [(row, MB)]}: peak RSS on CPU, peak CUDA memory allocated on cuda."""
    out: dict[str, list[tuple[dict[str, Any], float]]] = defaultdict(list)
    for r in rows:
        metric, _ = MEMORY_METRIC.get(r["device"], DEFAULT_MEMORY)
        mb = r["metrics"].get(metric)
        if mb is not None and mb > 0:
            out[metric].append((r, mb))
    return {k: v for k, v in out.items() if len(v) >= 2}  # one point says nothing


def memory_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Median latency against peak memory, one panel per kind of memory (CPU RSS, CUDA
    allocated), colour per backend, marker per model and phase; points named when few."""
    kinds = memory_points(rows)
    if not kinds:
        return False
    plt = _matplotlib()
    titles = dict([DEFAULT_MEMORY, *MEMORY_METRIC.values()])
    fig, axes = plt.subplots(1, len(kinds), figsize=(7.5 * len(kinds), 5.2), squeeze=False)
    backends = sorted({r["backend"] for pts in kinds.values() for r, _ in pts})
    colors = {b: f"C{i % 10}" for i, b in enumerate(backends)}
    shapes = sorted({(r["model"], r["phase"]) for pts in kinds.values() for r, _ in pts})
    markers = {s: "osD^v<>Pp*"[i % 10] for i, s in enumerate(shapes)}
    for ax, (metric, pts) in zip(axes[0], sorted(kinds.items()), strict=False):
        xs, ys = [mb for _, mb in pts], [r["metrics"][MEDIAN] for r, _ in pts]
        for r, mb in pts:
            ax.scatter(
                mb,
                r["metrics"][MEDIAN],
                s=55,
                color=colors[r["backend"]],
                marker=markers[(r["model"], r["phase"])],
                edgecolors="tab:red" if r.get("unstable") else "none",
                linewidths=1.5,
                zorder=3,
            )
            if len(pts) <= 16:
                ax.annotate(
                    _label(r["backend"], suffix(r)),
                    (mb, r["metrics"][MEDIAN]),
                    xytext=(5, 4),
                    textcoords="offset points",
                    fontsize=7,
                    alpha=0.85,
                )
        for axis, values in ((ax.xaxis, xs), (ax.yaxis, ys)):
            if _spans_decade(values):
                _log_axis(axis, values)
        if _spans_decade(xs):
            _pad_log_limits(ax.set_xlim, xs, 1.4)
        else:
            pad = (max(xs) - min(xs)) * 0.15 or max(xs) * 0.1
            ax.set_xlim(min(xs) - pad, max(xs) + pad * 2.5)  # room for the names
        if _spans_decade(ys):
            _pad_log_limits(ax.set_ylim, ys, 1.4)
        else:
            ax.set_ylim(0, max(ys) * 1.2)
        log = " (log)" if _spans_decade(xs) else ""
        ax.set_xlabel(f"{titles[metric]}, MB{log}  [{metric}]")
        ax.set_ylabel("median latency per call, ms" + (" (log)" if _spans_decade(ys) else ""))
        ax.set_title(f"Latency against {titles[metric]}", fontsize=11, loc="left")
        ax.grid(alpha=0.3, which="major")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=colors[b], label=b) for b in backends]
    handles += [Line2D([], [], ls="", marker=markers[s], color="grey", label=f"{s[0]} · {s[1]}") for s in shapes]
    if any(r.get("unstable") for pts in kinds.values() for r, _ in pts):
        handles.append(
            Line2D([], [], ls="", marker="o", mfc="none", mec="tab:red", mew=1.5, label="red edge: unstable")
        )
    axes[0][-1].legend(
        handles=handles,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=min(len(handles), 6),
        title="backend / model · phase",
        title_fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return _save(fig, path)


# -- a variant's per-op profile (bench.profile=true; tasks/measure/profiles.py's rows) --------------------
def profile_plot(rows: list[dict[str, Any]], name: str, path: Path) -> bool:
    """The top ops of one variant's call as horizontal bars of time per call, largest on top,
    each labelled with its share of the call and executions per call; the rest and the time
    outside ops in grey."""
    if not rows:
        return False
    plt = _matplotlib()
    ordered = list(reversed(rows))  # barh draws bottom-up
    fig, ax = plt.subplots(figsize=(8.5, 0.32 * len(rows) + 1.4))
    colors = ["0.7" if r["op"].startswith("(") else "C0" for r in ordered]
    ax.barh(range(len(ordered)), [r["us_per_call"] for r in ordered], color=colors)
    ax.set_yticks(range(len(ordered)), [r["op"] for r in ordered], fontsize=8)
    for i, r in enumerate(ordered):
        note = f" {r['share']:.1%}" + (f"  x{r['per_call']:g}" if r["per_call"] else "")
        ax.annotate(note, (r["us_per_call"], i), va="center", fontsize=7, xytext=(2, 0), textcoords="offset points")
    ax.set_xlim(0, max(r["us_per_call"] for r in rows) * 1.25)
    ax.set_xlabel("exclusive time per call, us  (label: share of the call, executions per call)")
    ax.set_title(f"Where the call's time goes: {name}", fontsize=10, loc="left")
    ax.grid(alpha=0.3, axis="x")
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)
