"""The quality change between two sweeps, per variant both measured (tasks/measure/quality.py).

Quality is deterministic: the same reference, tokens and windows give the same figures to
rounding, so a change needs no test, only a threshold above rounding and below what matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A loss: perplexity's increase over float32 eager grew by more than 1 percentage point (more
# than int8 weight-only quantisation costs in all; kernel order moves it by hundredths), or,
# without perplexity (random weights), top-1 agreement fell by more than 2 points (5 flips of 256).
PPL_LOSS = 0.01
TOP1_LOSS = 0.02


def quality_changes(base_runs: Mapping[str, Any], cand_runs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{variant: its quality in both sweeps, the change and whether it is a loss} of the variants
    both sweeps measured quality for."""
    out = {}
    for name in sorted(set(base_runs) & set(cand_runs)):
        row = quality_change(base_runs[name].data.metrics, cand_runs[name].data.metrics)
        if row is not None:
            out[name] = row
    return out


def quality_change(b: Mapping[str, float], c: Mapping[str, float]) -> dict[str, Any] | None:
    """The quality in the baseline's metrics `b` and the candidate's `c`, the change and whether
    it is a loss; None unless both measured it."""
    if "quality_top1" not in b or "quality_top1" not in c:
        return None
    row: dict[str, Any] = {"top1_baseline": b["quality_top1"], "top1_candidate": c["quality_top1"]}
    row["top1_change"] = c["quality_top1"] - b["quality_top1"]
    row["kl_baseline"], row["kl_candidate"] = b.get("quality_kl"), c.get("quality_kl")
    if "quality_ppl_increase" in b and "quality_ppl_increase" in c:
        row["ppl_increase_baseline"], row["ppl_increase_candidate"] = b["quality_ppl_increase"], c["quality_ppl_increase"]
        row["ppl_increase_change"] = c["quality_ppl_increase"] - b["quality_ppl_increase"]
        row["lost"] = row["ppl_increase_change"] > PPL_LOSS
    else:
        row["lost"] = row["top1_change"] < -TOP1_LOSS
    return row


def quality_cell(row: dict[str, Any] | None, verdict: str) -> str:
    """The compare table's quality column: the change, and a loss flagged (worse still when faster)."""
    if row is None:
        return "-"
    if "ppl_increase_change" in row:
        text = f"ppl {row['ppl_increase_baseline']:+.2%} -> {row['ppl_increase_candidate']:+.2%}"
    else:
        text = f"top1 {row['top1_baseline']:.0%} -> {row['top1_candidate']:.0%}"
    if row["lost"]:
        text += "  LOST QUALITY" + (" (faster, not a win)" if verdict == "faster" else "")
    return text


def quality_summary(changes: Mapping[str, dict[str, Any]]) -> list[str]:
    if not changes:
        return []
    lost = [n for n, r in changes.items() if r["lost"]]
    tail = f": {', '.join(lost)}" if lost else ""
    return [
        f"quality: {len(changes)} variant(s) compared, {len(lost)} lost quality{tail} (perplexity increase over float32 "
        f"eager up by > {PPL_LOSS:.0%} points, or without perplexity top-1 agreement down by > {TOP1_LOSS:.0%} points)"
    ]
