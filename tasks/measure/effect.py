"""Where a ratio's confidence interval lies against a band around 1: the one rule behind a
paired measurement's stop (tasks/paired.py `decided`) and compare's verdicts
(orchestrator/read/stats.py `verdict`). Pure Python: the driver imports it."""

from __future__ import annotations


def side(ci: tuple[float, float], low: float, high: float) -> str:
    """"above" the band [low, high] wholly, "below" it wholly, "within" it, or "across" an edge."""
    ci_low, ci_high = ci
    if ci_low > high:
        return "above"
    if ci_high < low:
        return "below"
    if low <= ci_low and ci_high <= high:
        return "within"
    return "across"


def band(min_effect: float) -> tuple[float, float]:
    """The ratios too close to 1 to matter: [1 - min_effect, 1 + min_effect]."""
    return 1 - min_effect, 1 + min_effect
