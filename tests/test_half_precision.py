"""float16 and bfloat16 on every backend whose runtime runs them, through the real jobs.

Each case is the tiny llama planned as a sweep plans it (conftest `planned_variant`: the
session's export cache, FAST_BENCH), exported by tasks.jobs.export_job and measured by
tasks.jobs.bench_job in this process: parity against transformers in the same dtype within
that dtype's tolerance (tasks/measure/parity.py ATOL), every top-1 token the same, decode checked over
all its steps. Combinations a runtime does not run (onnxruntime bfloat16 on CPU) are skipped
when planned, never attempted.

Half precision rounds the reference itself into ties (bfloat16 logits of 2-4 are 1/64 apart:
two of 512 are often equal), so parity asks every top-1 pick to be, in the reference, within
the tolerance of the reference's best (`top1_within_tolerance`), and reports exact agreement
beside it; where the exact pick differs, the test shows it is one of those near-ties.
"""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.plan.config import validate_all
from orchestrator.plan.placement import Capacity
from orchestrator.plan.planner import make_plan, unsupported
from tasks.jobs import bench_job, load_export
from tasks.measure.parity import ATOL
from tasks.specs import PAST
from tests.conftest import DECODE, compose_jobs

slow = pytest.mark.slow
BACKENDS = ("eager", "compile", "onnxruntime", "executorch")
CASES = [
    ("eager", "float16", "prefill"),
    ("eager", "float16", "decode"),
    ("eager", "bfloat16", "prefill"),
    ("eager", "bfloat16", "decode"),
    # an ONNX export takes ~15 s, an ExecuTorch one ~30-60 s, a compile 20-60 s (on 2 busy cores):
    # slow, and between executorch and compile one case per dtype and phase
    pytest.param("onnxruntime", "float16", "prefill", marks=slow),
    pytest.param("onnxruntime", "float16", "decode", marks=slow),
    pytest.param("executorch", "bfloat16", "decode", marks=slow),
    pytest.param("executorch", "float16", "prefill", marks=slow),
    pytest.param("compile", "float16", "decode", marks=slow),
]


def near_ties(ref_logits: np.ndarray, per_step_diffs: list[float]) -> list[str]:
    """Positions whose reference top-1 a backend within the step's max abs diff d may flip:
    top-1 minus top-2 of the reference logits [steps, B, 1, V] at most 2 d (each logit moved
    by at most d). Half precision rounds the reference itself: exact ties occur."""
    top2 = np.sort(ref_logits.astype(np.float32), axis=-1)[..., -2:]
    margins = (top2[..., 1] - top2[..., 0]).reshape(len(ref_logits), -1)  # [steps, B]
    return [
        f"step {t + 1} row {b}: margin {m:.3g} <= 2 x {d:.3g}"
        for t, (row, d) in enumerate(zip(margins, per_step_diffs, strict=True))
        for b, m in enumerate(row)
        if m <= 2 * d
    ]


@pytest.mark.parametrize("backend,dtype,phase", CASES)
def test_half_precision_parity(planned_variant, backend, dtype, phase):
    export, spec = planned_variant("model=llama", f"phase={phase}", f"backend={backend}", f"model.dtype={dtype}")
    assert spec.model.dtype == dtype and spec.runtime == backend

    meta, feeds, parity_data = load_export(export.out_dir)
    cache = [n for n in feeds if n.startswith(PAST)]
    assert bool(cache) == (phase == "decode")
    for name in cache:  # numpy has no bfloat16: its bits travel as uint16, the dtype beside them
        assert meta["input_dtypes"][name] == dtype
        assert feeds[name].dtype == (np.uint16 if dtype == "bfloat16" else np.float16)

    result = bench_job(spec)
    par = result.parity
    if par:
        print(
            f"\n{backend} {dtype} {phase}: max abs diff {par['max_abs_diff']:.3g}"
            + (f", cache {par['cache_max_abs_diff']:.3g}" if "cache_max_abs_diff" in par else "")
            + f" (atol {par['atol']:g}), top-1 {par['top1_agreement']:.0%} over {par['steps']} step(s)"
        )
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)

    assert par["passed"] and par["atol"] == ATOL[dtype]
    assert par["max_abs_diff"] <= ATOL[dtype] and par["top1_within_tolerance"] == 1.0
    if par["top1_agreement"] < 1:  # an exact flip is only ever a near-tie of the reference
        assert near_ties(parity_data["ref_logits"], par["per_step_max_abs_diff"])
    assert result.metrics["parity_max_abs_diff"] <= ATOL[dtype]
    if phase == "decode":  # every step, each fed the cache the backend returned the step before
        assert par["steps"] == DECODE.parity_steps == len(par["per_step_max_abs_diff"])
        assert max(par["per_step_max_abs_diff"]) == par["max_abs_diff"] <= ATOL[dtype]
    else:  # prefill: one call, and the caches it returned against the reference's
        assert par["steps"] == 1 and par["cache_max_abs_diff"] <= ATOL[dtype]
    assert result.samples_ns and result.metrics["latency_ms_median"] > 0


def test_onnxruntime_bfloat16_on_cpu_is_unsupported():
    configs, overrides = compose_jobs(["backend=onnxruntime", "model.dtype=bfloat16"])
    (point,) = validate_all(configs, overrides)
    reason = unsupported(point)
    assert reason and "bfloat16" in reason and "CPU provider" in reason


def test_a_half_precision_grid_plans_every_supported_combination():
    """model.dtype=float16,bfloat16 x backend=eager,compile,onnxruntime,executorch on a CPU
    node: 7 variants, and onnxruntime bfloat16 skipped with its reason."""
    jobs = [[f"model.dtype={d}", f"backend={b}"] for d in ("float16", "bfloat16") for b in BACKENDS]
    configs, overrides = compose_jobs(*jobs)
    cap = Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=0, memory=8 * 2**30)
    plan = make_plan(validate_all(configs, overrides), configs, overrides, cap)

    planned = {(pv.variant.backend.name, pv.variant.model.dtype) for pv in plan.variants}
    assert len(plan.variants) == 7 and len({pv.name for pv in plan.variants}) == 7
    assert planned == {(b, d) for d in ("float16", "bfloat16") for b in BACKENDS} - {("onnxruntime", "bfloat16")}
    (skipped,) = plan.skipped
    assert (skipped.variant.backend.name, skipped.variant.model.dtype) == ("onnxruntime", "bfloat16")
    assert "model.dtype=bfloat16" in skipped.reason and "CPU provider" in skipped.reason
    assert not [pv.name for pv in plan.variants if pv.unplaceable]
    # each dtype's variants share an export per format: none (eager, compile), onnx, executorch
    assert len(plan.exports) == 3 + 2
