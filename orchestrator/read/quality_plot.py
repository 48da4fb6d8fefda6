"""Speed against quality: one panel per model and phase, each variant a point, the Pareto front
marked (tasks/measure/quality.py measures the quality)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from orchestrator.read.draw import (
    MEDIAN,
    by_panel,
    join_label,
    log_axis,
    pad_log_limits,
    panel_grid,
    pyplot,
    save,
    suffix,
)
from orchestrator.read.labels import place_labels

PPL_INCREASE, KL, REFERENCE = "quality_ppl_increase", "quality_kl", "quality_reference"
KL_FLOOR = 1e-9  # a KL below this is drawn at it (a float32 reference variant: at it, unmeasured)
PPL_TIE = 0.1  # % of perplexity: closer to the reference than this is rounding (float32, mostly float16)


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower is better on each), by x."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], math.inf
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def quality_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Latency (x, log) against the perplexity increase over float32 eager (y; KL where a panel
    has no perplexity: random weights), one panel per model x phase; the Pareto front (faster
    and no worse) joined and ringed; each point labelled by backend and what else its name says."""
    panels = _panels(rows)
    if not panels:
        return False
    fig, drawn = panel_grid(pyplot(), panels, 7.2, lambda _: 4.6)
    labels = []  # each panel's (axes, points, texts), placed once the layout is final
    for ax, _, group in drawn:
        measured = [r for r in group if not r["metrics"].get(REFERENCE)]
        use_ppl = all(r["metrics"].get(PPL_INCREASE) is not None for r in measured)
        xs = [r["metrics"][MEDIAN] for r in group]
        ys = [_y(r["metrics"], use_ppl) for r in group]
        _points(ax, xs, ys, use_ppl)
        log_axis(ax.xaxis, xs)
        pad_log_limits(ax.set_xlim, xs, 1.5)
        (_ppl_axis if use_ppl else _kl_axis)(ax, ys)
        ax.set_xlabel("median latency per call, ms (log; a decode call is one token per row)", fontsize=9)
        ax.grid(alpha=0.3, which="major")
        labels.append((ax, list(zip(xs, ys, strict=True)), [_label(r) for r in group]))
    fig.suptitle(
        "Speed against quality — blue, ringed and joined: the Pareto front (nothing both faster and better); orange: another is faster and no worse",
        fontsize=10,
    )
    fig.tight_layout()
    for ax, points, texts in labels:
        place_labels(ax, points, texts)
    return save(fig, path)


def _label(r: dict[str, Any]) -> str:
    """Its backend and what else its name says; `(reference)` on a float32 reference variant."""
    return join_label(r["backend"], suffix(r)) + (" (reference)" if r["metrics"].get(REFERENCE) else "")


def _panels(rows: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """The panels where some variant measured a quality change, each with the float32 reference
    variants of its model and phase (quality_reference: the reference itself, drawn at no change)."""
    measured = by_panel(r for r in rows if r["metrics"].get(KL) is not None)
    for key, group in by_panel(r for r in rows if r["metrics"].get(REFERENCE)).items():
        if key in measured:
            measured[key] = group + measured[key]
    return measured


def _y(m: dict[str, float], use_ppl: bool) -> float:
    if m.get(REFERENCE):
        return 0.0 if use_ppl else KL_FLOOR
    return 100 * m[PPL_INCREASE] if use_ppl else max(m[KL], KL_FLOOR)


def _points(ax: Any, xs: list[float], ys: list[float], use_ppl: bool) -> None:
    """A panel's variants as points, the Pareto front joined and ringed."""
    # changes within rounding tie on the front: a perplexity within +-PPL_TIE %, a KL at the floor
    ranked = [0.0 if use_ppl and abs(y) < PPL_TIE else y for y in ys]
    front = pareto(list(zip(xs, ranked, strict=True)))
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "-", color="0.6", lw=1, zorder=1, drawstyle="steps-post")
    for i in range(len(xs)):
        on = i in front
        ax.plot(xs[i], ys[i], "o", color="C0" if on else "C1", ms=7, zorder=3, mec="black" if on else "none")


def _ppl_axis(ax: Any, ys: list[float]) -> None:
    """The perplexity increase: linear within +-PPL_TIE %, where rounding lives, log beyond."""
    from matplotlib.ticker import FuncFormatter  # lazy: matplotlib, only once a plot is drawn

    ax.set_yscale("symlog", linthresh=PPL_TIE)
    ax.set_ylim(min(min(ys), -PPL_TIE) * 2, max(max(ys), PPL_TIE) * 4)
    low, high = ax.get_ylim()  # 1-2-5 ticks beyond the linear band: a decade is often wider than the data
    steps = [m * 10.0**e for e in range(-1, 6) for m in (1, 2, 5) if m * 10.0**e >= PPL_TIE]
    ax.set_yticks([0.0] + [t for v in steps for t in (v, -v) if low <= t <= high])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.axhline(0, color="0.8", lw=0.8, zorder=0)
    ax.set_ylabel("perplexity increase over float32 eager, %", fontsize=9)


def _kl_axis(ax: Any, ys: list[float]) -> None:
    ax.set_yscale("log")
    ax.set_ylabel(f"KL(float32 eager || variant), nats (floor {KL_FLOOR:g})", fontsize=9)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 3)  # room for the labels above the highest point
