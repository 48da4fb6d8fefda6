"""Exported vs eager: the comparisons every phase's parity check is built from."""

from __future__ import annotations

from typing import Any

import numpy as np

# bench.parity_atol when null, by model dtype: the reference runs in the same dtype, and half
# precision differs from it by op order and accumulation
ATOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


# model.quant: a quantised model is checked against the float reference by the relative error of
# its logits (rel_error), at most this much at every step (and in prefill's returned caches). The
# random-weight tiny presets and smollm2-135m err by up to 0.04 (int8) and 0.44 (int4, 8da4w); weights
# zeroed err by 1.0, unrelated logits by about 1.4. The top-1 pick is reported, not required:
# quantisation flips near-ties, which quality metrics count.
QUANT_REL_ERROR = {"int8": 0.1, "int4": 0.7, "8da4w": 0.7, "q4_k_m": 0.7}


def tolerance(dtype: str, atol: float | None) -> float:
    return ATOL[dtype] if atol is None else atol


def rel_error(actual: np.ndarray, expected: np.ndarray, logits: bool = True) -> float:
    """||a - e|| / ||e||: of logits, over the last axis with each row centred (a softmax ignores a
    shift), the worst row: 0 for equal logits, 1 for flat ones (weights zeroed), about 1.4 for
    unrelated ones; of anything else (a cache), over the whole tensor."""
    a = actual.astype(np.float32)
    if logits:
        a, e = a - a.mean(-1, keepdims=True), expected - expected.mean(-1, keepdims=True)
    else:
        a, e = a.reshape(1, -1), expected.reshape(1, -1)
    norm = np.maximum(np.linalg.norm(e, axis=-1), np.finfo(np.float32).tiny)
    return float(np.max(np.linalg.norm(a - e, axis=-1) / norm))


def compare(actual: np.ndarray, expected: np.ndarray, atol: float = 0.0) -> tuple[float, float, float, float]:
    """(max abs diff, top-1 agreement, top-1 agreement within tolerance, rel_error) of logits [B, 1, V].

    The third counts a row as agreeing when the backend's pick is, in the reference, within
    `atol` of the reference's best: in half precision the reference's own top two are often
    tied after rounding, and picking either is not an error."""
    actual = actual.astype(np.float32)
    diff = float(np.max(np.abs(actual - expected)))
    pick = actual.argmax(-1)
    top1 = float(np.mean(pick == expected.argmax(-1)))
    picked = np.take_along_axis(expected, pick[..., None], axis=-1)[..., 0]
    within = float(np.mean(picked >= expected.max(-1) - atol))
    return diff, top1, within, rel_error(actual, expected)


def summary(steps: list[tuple[float, float, float, float]], atol: float) -> dict[str, Any]:
    """The parity record of one variant: per step max abs diff, top-1 and relative error, and
    the verdict: every difference within `atol` and every top-1 pick within tolerance of the
    reference's best (a tolerance wide enough for half precision must not hide a wrong argmax).
    A quantised variant is judged by quantized() instead."""
    diffs = [s[0] for s in steps]
    within = min(s[2] for s in steps)
    return {
        "steps": len(diffs),
        "max_abs_diff": max(diffs),
        "top1_agreement": min(s[1] for s in steps),
        "top1_within_tolerance": within,
        "max_rel_error": max(s[3] for s in steps),
        "per_step_max_abs_diff": diffs,
        "atol": atol,
        "passed": bool(max(diffs) <= atol and within == 1.0),
    }


def quantized(report: dict[str, Any], quant: str) -> dict[str, Any]:
    """A quantised variant's verdict: the logits' (and returned caches') relative error against
    the float reference within QUANT_REL_ERROR[quant] at every step."""
    bound = QUANT_REL_ERROR[quant]
    worst = max(report["max_rel_error"], report.get("cache_max_rel_error", 0.0))
    return {**report, "rel_error_bound": bound, "passed": bool(worst <= bound)}


def failure_text(par: dict[str, Any], quant: str) -> str:
    """Why a parity report failed, in one line: its worst error against its bound, and the step."""
    worst = int(np.argmax(par["per_step_max_abs_diff"]))
    why = (
        f"relative error {max(par['max_rel_error'], par.get('cache_max_rel_error', 0)):.3g} against the float "
        f"reference exceeds {par['rel_error_bound']:g} for model.quant={quant}"
        if "rel_error_bound" in par
        else f"logits differ from eager by {par['max_abs_diff']:.3g} (atol {par['atol']:g}), top-1 within "
        f"tolerance {par['top1_within_tolerance']:.0%}"
    )
    return f"{why} (worst at step {worst + 1} of {par['steps']})"
