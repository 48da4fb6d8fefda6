"""What every plot shares: matplotlib (Agg, imported when first drawn), the row keys, labels,
log axes with plain-number ticks, and the panels of one model x phase each."""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MEDIAN, P90 = "latency_ms_median", "latency_ms_p90"
CI_LOW, CI_HIGH = "latency_ms_median_ci_low", "latency_ms_median_ci_high"
DPI = 110
PALETTE = ("C0", "C1", "C2", "C4", "C5", "C6", "C8", "C9")  # no red: red marks unstable


def pyplot():
    import matplotlib  # lazy: matplotlib, only once a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib, only once a plot is drawn

    return plt


def importing() -> threading.Thread:
    """pyplot() in a thread of its own, started: a sweep imports matplotlib while its exports
    run rather than after its last benchmark; join() it before anything is timed."""
    thread = threading.Thread(target=pyplot, name="import-pyplot", daemon=True)
    thread.start()
    return thread


def _base(r: dict[str, Any]) -> str:
    return f"{r['model']}_{r['phase']}_{r['backend']}_{r['device']}"


def suffix(r: dict[str, Any]) -> str:
    """What the name says beyond model, phase, backend and device (`ctx64_bf16`), or ''."""
    base = _base(r)
    return r["name"][len(base) :].lstrip("_") if r["name"].startswith(base) else ""


def join_label(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def spans_decade(values: list[float]) -> bool:
    v = [x for x in values if x and x > 0]
    return bool(v) and max(v) / min(v) >= 10


def log_axis(axis, values: list[float]) -> None:
    """A log axis with plain-number ticks (1, 2, 5, 10, ...), readable without exponents."""
    import matplotlib.ticker as mt  # lazy: matplotlib, only once a plot is drawn

    if axis is axis.axes.xaxis:
        axis.axes.set_xscale("log")
    else:
        axis.axes.set_yscale("log")
    lo, hi = min(values), max(values)
    subs = (1.0, 2.0, 5.0) if hi / lo < 1000 else (1.0,)
    axis.set_major_locator(mt.LogLocator(subs=subs))
    axis.set_major_formatter(mt.FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(mt.NullFormatter())


def pad_log_limits(set_lim, values: list[float], factor: float = 1.6) -> None:
    set_lim(min(values) / factor, max(values) * factor)


def save(fig, path: Path) -> bool:
    import matplotlib.pyplot as plt  # lazy: matplotlib, only once a plot is drawn

    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return True



Panel = tuple[str, str]  # (model, phase)


def by_panel(rows: Iterable[dict[str, Any]]) -> dict[Panel, list[dict[str, Any]]]:
    """The rows grouped one panel per model x phase, each in the rows' order."""
    panels: dict[Panel, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        panels[(r["model"], r["phase"])].append(r)
    return dict(panels)


def panel_grid(
    plt: Any, panels: dict[Panel, list[dict[str, Any]]], width: float, height: Callable[[int], float]
) -> tuple[Any, list[tuple[Any, Panel, list[dict[str, Any]]]]]:
    """A figure of the panels in sorted order, one column for up to two and two beyond, each
    titled "model · phase"; a row of panels is height(its longest panel's row count) inches tall.
    Returns the figure and (axes, panel, its rows) of each panel."""
    keys = sorted(panels)
    ncols = 1 if len(keys) <= 2 else 2
    lines = [keys[i : i + ncols] for i in range(0, len(keys), ncols)]
    heights = [height(max(len(panels[k]) for k in line)) for line in lines]
    fig, axes = plt.subplots(
        math.ceil(len(keys) / ncols), ncols, figsize=(width * ncols, sum(heights) + 0.6),
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys, strict=False):
        ax.set_title(f"{key[0]} · {key[1]}", fontsize=11, loc="left")
    return fig, [(ax, key, panels[key]) for ax, key in zip(axes.flat, keys, strict=False)]
