"""The plots a sweep gets when it varied what they need: decode against context length,
speed-up over eager, latency against peak memory."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.read.draw import (
    MEDIAN,
    PALETTE,
    join_label,
    log_axis,
    pad_log_limits,
    pyplot,
    save,
    spans_decade,
    suffix,
)
from orchestrator.read.labels import place_labels

CONTEXT_LEN = "phase.context_len"
MEMORY_METRIC = {"cuda": ("cuda_peak_allocated_mb", "peak CUDA memory allocated")}
DEFAULT_MEMORY = ("peak_rss_mb", "peak resident memory (RSS)")


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
    plt = pyplot()
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models) + 0.6), squeeze=False)
    for (model, rs), (ax_lat, ax_tok) in zip(models.items(), axes, strict=False):
        lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            rest = re.sub(r"(^|_)ctx\d+", "", suffix(r)).strip("_")
            lines[join_label(r["backend"], r["device"], rest)].append(r)
        lat_values, tok_values = [], []
        for k, (label, pts) in enumerate(sorted(lines.items())):
            pts.sort(key=_context)
            lat, tok = _context_lines(ax_lat, ax_tok, k, label, pts)
            lat_values += lat
            tok_values += tok
        contexts = sorted({_context(r) for r in rs})
        unstable = any(r.get("unstable") for r in rs)
        _context_axes(plt, ax_lat, model, contexts, lat_values, "median latency per decode step, ms", "decode latency", unstable)
        _context_axes(plt, ax_tok, model, contexts, tok_values, "tokens/s (whole batch)", "decode throughput", False)
    fig.tight_layout()
    return save(fig, path)


def _context_lines(ax_lat: Any, ax_tok: Any, k: int, label: str, pts: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The k-th line of a model's latency and throughput panels, unstable points ringed in red;
    the values drawn on each."""
    style = {"marker": "osD^v<>P"[k % 8], "ms": 8 - k % 3, "alpha": 0.85, "color": PALETTE[k % len(PALETTE)], "label": label}
    x = [_context(r) for r in pts]  # markers differ: lines that coincide stay visible
    lat = [r["metrics"][MEDIAN] for r in pts]
    ax_lat.plot(x, lat, **style)
    for xi, r in zip(x, pts, strict=True):
        if r.get("unstable"):  # a red ring
            ax_lat.plot([xi], [r["metrics"][MEDIAN]], "o", ms=13, mfc="none", mec="tab:red", mew=1.5)
    tok = [(xi, t) for xi, r in zip(x, pts, strict=True) if (t := r["metrics"].get("tokens_per_s")) is not None]
    if tok:
        ax_tok.plot([t[0] for t in tok], [t[1] for t in tok], **style)
    return lat, [t[1] for t in tok]


def _context_axes(plt: Any, ax: Any, model: str, contexts: list[int], values: list[float], ylabel: str, title: str, unstable: bool) -> None:
    """A context-length panel's axes, title and legend (with the red ring's meaning when `unstable`)."""
    from matplotlib.lines import Line2D  # lazy: matplotlib, only once a plot is drawn

    ax.set_title(f"{model} · {title} vs context length", fontsize=11, loc="left")
    ax.set_xlabel("context length (tokens already in the KV cache)")
    ax.set_ylabel(ylabel)
    if contexts[-1] / contexts[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    if values and spans_decade(values):
        log_axis(ax.yaxis, values)
    elif values:
        ax.set_ylim(0, max(values) * 1.15)
    ax.grid(alpha=0.3)
    if values:
        handles, _ = ax.get_legend_handles_labels()
        if unstable:
            handles.append(Line2D([], [], ls="", marker="o", ms=11, mfc="none", mec="tab:red", label="unstable"))
        ax.legend(handles=handles, fontsize=8, title="backend", title_fontsize=8)


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
        label = join_label(f"{model} · {phase}", device if len(devices) > 1 else "", rest)
        labels.append(label)
        for b, r in others.items():
            cells[(label, b)] = eager["metrics"][MEDIAN] / r["metrics"][MEDIAN]
            backends.add(b)
    return labels, sorted(backends), cells


def speedup_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    labels, backends, cells = speedups(rows)
    if not cells:
        return False
    import matplotlib.colors as mc  # lazy: matplotlib, only once a plot is drawn

    plt = pyplot()
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
    return save(fig, path)


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
    plt = pyplot()
    titles = dict([DEFAULT_MEMORY, *MEMORY_METRIC.values()])
    fig, axes = plt.subplots(1, len(kinds), figsize=(7.5 * len(kinds), 5.2), squeeze=False)
    backends = sorted({r["backend"] for pts in kinds.values() for r, _ in pts})
    colors = {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(backends)}  # no red: its edge marks unstable
    shapes = sorted({(r["model"], r["phase"]) for pts in kinds.values() for r, _ in pts})
    markers = {s: "osD^v<>Pp*"[i % 10] for i, s in enumerate(shapes)}
    for ax, (metric, pts) in zip(axes[0], sorted(kinds.items()), strict=False):
        for r, mb in pts:
            style = {"color": colors[r["backend"]], "marker": markers[(r["model"], r["phase"])]}
            ax.scatter(mb, r["metrics"][MEDIAN], s=55, edgecolors="tab:red" if r.get("unstable") else "none", linewidths=1.5, zorder=3, **style)
        _memory_axes(ax, [mb for _, mb in pts], [r["metrics"][MEDIAN] for r, _ in pts], metric, titles[metric])
    unstable = any(r.get("unstable") for pts in kinds.values() for r, _ in pts)
    _memory_legend(axes[0][-1], colors, markers, unstable)
    fig.tight_layout()
    for ax, (_, pts) in zip(axes[0], sorted(kinds.items()), strict=False):
        if len(pts) <= 16:  # named where they fit; more would crowd the panel
            place_labels(ax, [(mb, r["metrics"][MEDIAN]) for r, mb in pts], [join_label(r["backend"], suffix(r)) for r, _ in pts], 7)
    return save(fig, path)


def _memory_axes(ax: Any, xs: list[float], ys: list[float], metric: str, title: str) -> None:
    """Log axes where the values span a decade, else linear from zero with room for the names."""
    for axis, values in ((ax.xaxis, xs), (ax.yaxis, ys)):
        if spans_decade(values):
            log_axis(axis, values)
    if spans_decade(xs):
        pad_log_limits(ax.set_xlim, xs, 1.4)
    else:
        pad = (max(xs) - min(xs)) * 0.15 or max(xs) * 0.1
        ax.set_xlim(min(xs) - pad, max(xs) + pad * 2.5)  # room for the names
    if spans_decade(ys):
        pad_log_limits(ax.set_ylim, ys, 1.4)
    else:
        ax.set_ylim(0, max(ys) * 1.2)
    log = " (log)" if spans_decade(xs) else ""
    ax.set_xlabel(f"{title}, MB{log}  [{metric}]")
    ax.set_ylabel("median latency per call, ms" + (" (log)" if spans_decade(ys) else ""))
    ax.set_title(f"Latency against {title}", fontsize=11, loc="left")
    ax.grid(alpha=0.3, which="major")


def _memory_legend(ax: Any, colors: dict[str, str], markers: dict[tuple[str, str], str], unstable: bool) -> None:
    """Colour per backend, marker per model · phase, under the last panel."""
    from matplotlib.lines import Line2D  # lazy: matplotlib, only once a plot is drawn

    handles = [Line2D([], [], ls="", marker="o", color=c, label=b) for b, c in colors.items()]
    handles += [Line2D([], [], ls="", marker=m, color="grey", label=f"{s[0]} · {s[1]}") for s, m in markers.items()]
    if unstable:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="tab:red", mew=1.5, label="red edge: unstable"))
    ax.legend(
        handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(len(handles), 6),
        title="backend / model · phase", title_fontsize=8, frameon=False,
    )
