"""Exported vs eager: one step, and many decode steps feeding the backend's own cache back.

A decode graph that silently drops its cache still gives plausible logits on its first
step; only running several steps, each fed the cache the previous step returned, and
comparing every step with the reference catches it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.runtimes.base import Session


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
    past_names = [n for n in feeds if n.startswith("past_key_values.")]
    logits_per_step = []
    for t in range(tokens.shape[1]):
        step_feeds["input_ids"] = np.ascontiguousarray(tokens[:, t : t + 1])
        step_feeds["cache_position"] = np.array([start + t], dtype=np.int64)
        logits, *present = session.run(step_feeds)
        logits_per_step.append(logits)
        step_feeds.update(zip(past_names, present, strict=True))  # the backend's own cache, fed back
    return logits_per_step


def check(session: Session, feeds: dict[str, np.ndarray], parity: dict[str, np.ndarray], atol: float) -> dict[str, Any]:
    ref = parity["ref_logits"]  # [N, B, 1, V]
    if "step_tokens" not in parity:  # prefill: one call
        diffs_top1 = [compare(session.run(feeds)[0], ref[0])]
    else:
        tokens = parity["step_tokens"]  # [B, N]
        position = int(feeds["cache_position"][0])
        run_steps = getattr(session, "run_steps", None) or (lambda f, tok, pos: host_steps(session, f, tok, pos))
        diffs_top1 = [compare(logits, ref[t]) for t, logits in enumerate(run_steps(feeds, tokens, position))]
    diffs = [d for d, _ in diffs_top1]
    max_diff = max(diffs)
    return {
        "steps": len(diffs),
        "max_abs_diff": max_diff,
        "top1_agreement": min(t for _, t in diffs_top1),
        "per_step_max_abs_diff": diffs,
        "atol": atol,
        "passed": bool(max_diff <= atol),
    }
