"""TTFT and time per output token of each predicted generation (orchestrator/read/generation.py),
as horizontal bars side by side, one bar per runtime: the two figures a user of a chat feels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.read.draw import PALETTE, join_label, pyplot, save
from orchestrator.read.generation import RULE, generations


def _ms(v: float) -> str:
    """1,012 ms, 66.1 ms, 0.098 ms: whole milliseconds from 100 up, never an exponent."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _label(g: Any, models: int) -> str:
    return join_label(g.model if models > 1 else "", g.backend, g.device, f"(P{g.prompt} N{g.new_tokens}, B{g.batch})")


def generation_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Left: predicted TTFT; right: mean TPOT with its p90 as a whisker; one bar per generation."""
    gens = sorted(generations(rows), key=lambda g: (g.model, g.tpot_ms_mean))
    if not gens:
        return False
    models = len({g.model for g in gens})
    labels = [_label(g, models) for g in gens]
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(gens) + 1.8), sharey=True)
    y = list(range(len(gens)))
    colors = [PALETTE[i % len(PALETTE)] for i in y]
    left.barh(y, [g.ttft_ms for g in gens], color=colors, alpha=0.85)
    right.barh(y, [g.tpot_ms_mean for g in gens], color=colors, alpha=0.85)
    right.errorbar([g.tpot_ms_mean for g in gens], y, xerr=[[0] * len(gens), [g.tpot_ms_p90 - g.tpot_ms_mean for g in gens]],
                   fmt="none", ecolor="0.25", capsize=4)  # fmt: skip
    for i, g in enumerate(gens):
        left.annotate(f"{_ms(g.ttft_ms)} ms", (g.ttft_ms, i), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        right.annotate(f"{_ms(g.tpot_ms_mean)} ms (p90 {_ms(g.tpot_ms_p90)}), {g.tokens_per_s:,.0f} tok/s", (g.tpot_ms_p90, i),
                       xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    left.set_yticks(y, labels, fontsize=9)
    left.set_ylim(len(gens) - 0.5, -0.5)
    left.set_xlim(0, max(g.ttft_ms for g in gens) * 1.35)
    right.set_xlim(0, max(g.tpot_ms_p90 for g in gens) * 1.9)  # room for the value labels
    left.set_title("time to first token (prefill), ms", fontsize=10, loc="left")
    right.set_title("time per output token: mean, whisker p90; ms", fontsize=10, loc="left")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Whole generation, predicted from the sweep's prefill and decode variants", fontsize=11, x=0.01, ha="left")
    fig.text(0.01, 0.0, RULE, fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save(fig, path)
