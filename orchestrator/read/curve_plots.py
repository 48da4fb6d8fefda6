"""Decode latency against cache depth (a variant's depth series) and aggregate throughput
against batch (a phase.batch sweep), one line per runtime, one panel per model: where the
runtimes' curves cross, and where each stops growing (its knee, orchestrator/read/curves.py)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.read.curves import BATCH, DEPTH_MEDIAN, KNEE_RULE, knee
from orchestrator.read.draw import PALETTE, join_label, log_axis, pyplot, save, spans_decade, suffix

CI = ("depth_latency_ms_median_ci_low", "depth_latency_ms_median_ci_high")


def _style(k: int, label: str) -> dict[str, Any]:
    """The k-th line's look: markers and sizes differ, so lines that coincide stay visible."""
    return {"marker": "osD^v<>P"[k % 8], "ms": 7 - k % 3, "alpha": 0.85, "color": PALETTE[k % len(PALETTE)], "label": label}


def _base2_axis(ax: Any, ticks: list[int]) -> None:
    """A log2 x axis ticked at exactly the values measured."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def depth_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Median decode latency (95% CI as error bars) against the cache depth, one panel per model."""
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if len(r.get("series", {}).get(DEPTH_MEDIAN, ())) >= 2:
            by_model[r["model"]].append(r)
    if not by_model:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(len(by_model), 1, figsize=(8, 3.8 * len(by_model) + 0.5), squeeze=False)
    for (model, rs), (ax,) in zip(sorted(by_model.items()), axes, strict=True):
        values, depths = [], set()
        for k, r in enumerate(sorted(rs, key=lambda r: r["name"])):
            pts = sorted(r["series"][DEPTH_MEDIAN])
            x, y = [p[0] for p in pts], [p[1] for p in pts]
            lo, hi = (dict(r["series"].get(c, ())) for c in CI)
            err = [[max(0.0, v - lo.get(d, v)) for d, v in pts], [max(0.0, hi.get(d, v) - v) for d, v in pts]]
            ax.errorbar(x, y, yerr=err, capsize=3, **_style(k, join_label(r["backend"], r["device"], suffix(r))))
            values += y
            depths |= set(x)
        _base2_axis(ax, sorted(depths))
        if spans_decade(values):
            log_axis(ax.yaxis, values)
        ax.set_ylim(bottom=0 if not spans_decade(values) else None)
        ax.set_title(f"{model} · decode latency by cache depth (each line: one variant, one export)", fontsize=10, loc="left")
        ax.set_xlabel("positions in the cache (depth)", fontsize=9)
        ax.set_ylabel("median latency per step, ms", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    return save(fig, path)


def _batch(r: dict[str, Any]) -> int | None:
    try:
        return int(float(r.get("params", {}).get(BATCH)))
    except (TypeError, ValueError):
        return None


def batch_lines(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """model -> line label -> (batch, aggregate tokens/s) points, for lines of two batches or more."""
    lines: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        b, tps = _batch(r), r["metrics"].get("tokens_per_s")
        if b is None or tps is None:
            continue
        rest = re.sub(r"(^|_)b\d+(?=_|$)", "", suffix(r)).strip("_")
        lines[r["model"]][join_label(r["phase"], r["backend"], r["device"], rest)].append((b, tps))
    out = {m: {k: sorted(p) for k, p in ls.items() if len(p) >= 2} for m, ls in lines.items()}
    return {m: ls for m, ls in sorted(out.items()) if ls}


def batch_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Aggregate tokens/s against batch, one panel per model; each line's knee ringed."""
    models = batch_lines(rows)
    if not models:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(len(models), 1, figsize=(8, 3.8 * len(models) + 0.6), squeeze=False)
    for (model, lines), (ax,) in zip(models.items(), axes, strict=True):
        values, batches = [], set()
        for k, (label, pts) in enumerate(sorted(lines.items())):
            b_knee, stopped = knee(pts)
            style = _style(k, label + (f" (knee b{b_knee})" if stopped else " (no knee)"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
            if stopped:
                ax.plot([b_knee], [dict(pts)[b_knee]], "o", ms=14, mfc="none", mec=style["color"], mew=1.5)
            values += [p[1] for p in pts]
            batches |= {p[0] for p in pts}
        _base2_axis(ax, sorted(batches))
        if spans_decade(values):
            log_axis(ax.yaxis, values)
        ax.set_title(f"{model} · throughput by batch (ring: knee)", fontsize=10, loc="left")
        ax.set_xlabel("batch (sequences per call)", fontsize=9)
        ax.set_ylabel("aggregate tokens/s", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.text(0.01, 0.0, KNEE_RULE, fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save(fig, path)
