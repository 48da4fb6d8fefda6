"""The history plot: one panel per variant and machine, its median latency per sweep with the
median's 95% interval, in the series' order; the sweeps where it changed marked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from orchestrator.read.draw import pyplot, save
from orchestrator.read.history import Point, Series

NAME = "history.png"
MAX_TICKS = 12  # sweep labels per panel at most: beyond, every k-th
MAX_TITLE = 90  # characters of a panel's title (the machine's line can be long)
MIN_SPAN = 0.2  # a panel's y range: at least this fraction of its highest value
CHANGE_STYLE = {"slower": ("^", "tab:red"), "faster": ("v", "tab:green")}


def history_plot(series: Series, path: Path, title: str) -> bool:
    """One panel per (machine, variant), stacked; x: the sweeps of its series (start time and
    code revision), y: median latency in ms with its 95% interval as a bar; red up-triangles:
    slower than the sweep before (the verdict's rules), green down-triangles: faster."""
    if not series:
        return False
    plt = pyplot()
    n = len(series)
    widest = max(len(points) for points in series.values())
    fig, axes = plt.subplots(n, 1, figsize=(max(7.5, 0.75 * min(widest, MAX_TICKS) + 3), 3.1 * n + 0.8), squeeze=False)
    for ax, ((machine, variant), points) in zip(axes[:, 0], series.items(), strict=True):
        panel(ax, points)
        text = f"{variant} — {machine}"
        ax.set_title(text if len(text) <= MAX_TITLE else text[: MAX_TITLE - 1] + "…", fontsize=10, loc="left")
    handles = [
        plt.Line2D([], [], marker="o", color="tab:blue", ls="-", label="median, bar: its 95% interval"),
        *(plt.Line2D([], [], marker=m, color=c, ls="", ms=9, label=f"{w} than the sweep before") for w, (m, c) in CHANGE_STYLE.items()),
    ]
    height = 3.1 * n + 0.8  # inches: the title and the legend take the top 0.8
    fig.suptitle(title, fontsize=11, y=1 - 0.05 / height, va="top")
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=9, frameon=False, bbox_to_anchor=(0.5, 1 - 0.35 / height))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, path)


def panel(ax: Any, points: list[Point]) -> None:
    xs = range(len(points))
    medians = [p.median for p in points]
    lows, highs = zip(*(p.interval for p in points), strict=True)
    ax.plot(xs, medians, "o-", color="tab:blue", ms=5, lw=1.2, zorder=3)
    ax.vlines(xs, lows, highs, color="tab:blue", lw=5, alpha=0.3)
    top = max(highs)
    for x, p in zip(xs, points, strict=True):
        if p.change in CHANGE_STYLE and p.ratio:
            marker, color = CHANGE_STYLE[p.change]
            ax.plot([x], [p.median], marker, color=color, ms=11, zorder=4)
            ax.annotate(f"{p.ratio[0]:.2f}x", (x, p.median), xytext=(0, 9 if p.change == "slower" else -11),
                        textcoords="offset points", ha="center", va="bottom" if p.change == "slower" else "top",
                        fontsize=8, color=color)  # fmt: skip
    step = max(1, math.ceil(len(points) / MAX_TICKS))
    shown = list(xs)[::step]
    ax.set_xticks(shown, [f"{points[i].when}\n{points[i].commit}" for i in shown], fontsize=8)
    ax.set_xlim(-0.5, len(points) - 0.5)
    low = min(lows)
    pad = max((top - low) * 0.25, top * MIN_SPAN / 2 - (top - low) / 2)  # room for the ratios' labels
    ax.set_ylim(max(0.0, low - pad), top + pad)
    ax.set_ylabel("median, ms", fontsize=9)
    ax.grid(alpha=0.3)
