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
import yaml

from orchestrator.plan.config import validate_all
from orchestrator.plan.placement import Capacity
from orchestrator.plan.planner import make_plan
from orchestrator.plan.support import unsupported
from tasks.export import format_module
from tasks.jobs import bench_job
from tasks.measure.parity import ATOL
from tasks.phases import phase_names
from tasks.runtimes import runtime_module
from tasks.specs import PAST
from tasks.worker.entries import load_export
from tests.conftest import BACKEND_NAMES, CONF, DECODE, backend_yaml, compose_jobs

slow = pytest.mark.slow
HALF = ("float16", "bfloat16")
BACKENDS = {b: backend_yaml(b) for b in BACKEND_NAMES}
SYNTHETIC = [p for p in phase_names() if "app" not in yaml.safe_load((CONF / "phase" / f"{p}.yaml").read_text())]


def runs_on_cpu(backend: str, dtype: str) -> bool:
    """The runtime runs the dtype on the CPU, and the exporter builds it (genai: PRECISIONS only)."""
    from tasks.export._genai import PRECISIONS

    if BACKENDS[backend]["export_options"].get("exporter") == "genai" and dtype not in PRECISIONS:
        return False
    return dtype in runtime_module(BACKENDS[backend]["runtime"]).DTYPES.get("cpu", ())


def cases() -> list:
    """Fast: every case of a backend that neither exports a file nor takes options (it runs the
    graph as it is). Slow (an export or a compile takes tens of seconds): every other backend,
    each half dtype it runs, one phase, alternating between backends."""
    quick = [b for b, cfg in BACKENDS.items() if cfg["export_format"] == "none" and not cfg["options"]]
    out: list = [(b, d, p) for b in quick for d in HALF for p in SYNTHETIC if runs_on_cpu(b, d)]
    for i, b in enumerate(b for b in BACKENDS if b not in quick):
        for j, d in enumerate(x for x in HALF if runs_on_cpu(b, x)):
            out.append(pytest.param(b, d, SYNTHETIC[(i + j) % len(SYNTHETIC)], marks=slow))
    return out


CASES = cases()

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
    own_cache = format_module(BACKENDS[backend]["export_format"]).OWN_CACHE  # llama.cpp: no cache in or out
    assert bool(cache) == (phase == "decode" and not own_cache)
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
        assert par["steps"] == 1 and (own_cache or par["cache_max_abs_diff"] <= ATOL[dtype])
    assert result.samples_ns and result.metrics["latency_ms_median"] > 0


def test_onnxruntime_bfloat16_on_cpu_is_unsupported():
    configs, overrides = compose_jobs(["backend=onnxruntime", "model.dtype=bfloat16"])
    (point,) = validate_all(configs, overrides)
    reason = unsupported(point)
    assert reason and "bfloat16" in reason and "CPU provider" in reason


def test_a_half_precision_grid_plans_every_supported_combination():
    """model.dtype=float16,bfloat16 x every backend on a CPU node: a variant for every
    combination the runtime runs on the CPU, the others skipped with their reason."""
    jobs = [[f"model.dtype={d}", f"backend={b}"] for d in HALF for b in BACKENDS]
    configs, overrides = compose_jobs(*jobs)
    cap = Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=0, memory=8 * 2**30)
    plan = make_plan(validate_all(configs, overrides), configs, overrides, cap)

    want = {(b, d) for d in HALF for b in BACKENDS if runs_on_cpu(b, d)}
    planned = {(pv.variant.backend.name, pv.variant.model.dtype) for pv in plan.variants}
    assert planned == want and len({pv.name for pv in plan.variants}) == len(want)
    skipped = {(s.variant.backend.name, s.variant.model.dtype): s.reason for s in plan.skipped}
    assert set(skipped) == {(b, d) for d in HALF for b in BACKENDS} - want
    for (b, d), reason in skipped.items():
        assert f"model.dtype={d}" in reason or "genai" in reason, reason
        if "genai" not in reason:
            assert runtime_module(BACKENDS[b]["runtime"]).DTYPE_NOTE in reason
    assert not [pv.name for pv in plan.variants if pv.unplaceable]
    # one per format, its export options and dtype
    assert len(plan.exports) == len({(BACKENDS[b]["export_format"], repr(BACKENDS[b]["export_options"]), d) for b, d in want})
