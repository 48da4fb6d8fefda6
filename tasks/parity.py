"""Exported vs eager: the comparisons every phase's parity check is built from.

A decode graph that silently drops its cache still gives plausible logits on its first
step; only running several steps, each fed the cache the previous step returned, and
comparing every step with the reference catches it (tasks/phases/decode.py does).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.runtimes._base import Session
from tasks.specs import PAST

# bench.parity_atol when null: the max abs logits difference allowed, by model dtype. The
# reference is the transformers model in the same dtype; half precision differs by op
# order and accumulation (measured on the tiny models, prefill and decode, all four
# backends: float16 up to 5.3e-3, bfloat16 up to 4.3e-2).
ATOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


def tolerance(dtype: str, atol: float | None) -> float:
    return ATOL[dtype] if atol is None else atol


def compare(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs diff, top-1 agreement) of logits [B, 1, V]."""
    actual = actual.astype(np.float32)
    diff = float(np.max(np.abs(actual - expected)))
    top1 = float(np.mean(actual.argmax(-1) == expected.argmax(-1)))
    return diff, top1


def host_steps(session: Session, feeds: dict[str, np.ndarray], tokens: np.ndarray, start: int) -> list[np.ndarray]:
    """Consecutive decode steps through run(): each step's present cache becomes the next
    step's past. Returns each step's logits [B, 1, V]."""
    step_feeds = dict(feeds)
    past_names = [n for n in feeds if n.startswith(PAST)]
    logits_per_step = []
    for t in range(tokens.shape[1]):
        step_feeds["input_ids"] = np.ascontiguousarray(tokens[:, t : t + 1])
        step_feeds["cache_position"] = np.array([start + t], dtype=np.int64)
        logits, *present = session.run(step_feeds)
        logits_per_step.append(logits)
        step_feeds.update(zip(past_names, present, strict=True))  # the backend's own cache, fed back
    return logits_per_step


def summary(diffs_top1: list[tuple[float, float]], atol: float) -> dict[str, Any]:
    """The parity record of one variant: per step max abs diff and top-1, and the verdict."""
    diffs = [d for d, _ in diffs_top1]
    max_diff = max(diffs)
    return {
        "steps": len(diffs),
        "max_abs_diff": max_diff,
        "top1_agreement": min(t for _, t in diffs_top1),
        "per_step_max_abs_diff": diffs,
        "atol": atol,
        # top-1 must agree too: a tolerance wide enough for half precision could hide a wrong argmax
        "passed": bool(max_diff <= atol and min(t for _, t in diffs_top1) == 1.0),
    }
