"""Exported vs eager: the comparisons every phase's parity check is built from."""

from __future__ import annotations

from typing import Any

import numpy as np

# bench.parity_atol when null, by model dtype: the reference runs in the same dtype, and half
# precision differs from it by op order and accumulation
ATOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


def tolerance(dtype: str, atol: float | None) -> float:
    return ATOL[dtype] if atol is None else atol


def compare(actual: np.ndarray, expected: np.ndarray, atol: float = 0.0) -> tuple[float, float, float]:
    """(max abs diff, top-1 agreement, top-1 agreement within tolerance) of logits [B, 1, V].

    The last counts a row as agreeing when the backend's pick is, in the reference, within
    `atol` of the reference's best: in half precision the reference's own top two are often
    tied after rounding, and picking either is not an error."""
    actual = actual.astype(np.float32)
    diff = float(np.max(np.abs(actual - expected)))
    pick = actual.argmax(-1)
    top1 = float(np.mean(pick == expected.argmax(-1)))
    picked = np.take_along_axis(expected, pick[..., None], axis=-1)[..., 0]
    within = float(np.mean(picked >= expected.max(-1) - atol))
    return diff, top1, within


def summary(steps: list[tuple[float, float, float]], atol: float) -> dict[str, Any]:
    """The parity record of one variant: per step max abs diff and top-1, and the verdict:
    every difference within `atol` and every top-1 pick within tolerance of the reference's
    best (a tolerance wide enough for half precision must not hide a wrong argmax)."""
    diffs = [d for d, _, _ in steps]
    within = min(w for _, _, w in steps)
    return {
        "steps": len(diffs),
        "max_abs_diff": max(diffs),
        "top1_agreement": min(t for _, t, _ in steps),
        "top1_within_tolerance": within,
        "per_step_max_abs_diff": diffs,
        "atol": atol,
        "passed": bool(max(diffs) <= atol and within == 1.0),
    }
