"""What every plot shares: matplotlib (Agg, imported when first drawn), the row keys, labels,
log axes with plain-number ticks."""

from __future__ import annotations

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

