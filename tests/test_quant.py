"""model.quant: the axis planned (names, export keys, skipped points with reasons, one-line
errors), torchao's quantisation of a module, the quantised parity verdict; and, slow, eager and
ExecuTorch running quantised models against the float reference, and a broken quantisation caught."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.plan.config import ConfigError
from tasks.measure.parity import QUANT_REL_ERROR, compare, quantized, summary
from tests.conftest import BACKEND_NAMES
from tests.test_plan import names, plan_of

BACKENDS = ",".join(BACKEND_NAMES)
QUANTS = "none,int8,int4,8da4w"


def test_every_point_of_the_quant_grid_is_planned_or_skipped_with_a_reason():
    plan = plan_of(phase="prefill,decode", backend=BACKENDS, **{"model.quant": QUANTS})
    planned, skipped = names(plan), [s.name for s in plan.skipped]
    assert len(planned) + len(skipped) == 2 * len(BACKEND_NAMES) * 4 and len(set(planned + skipped)) == 8 * len(BACKEND_NAMES)
    for phase in ("prefill", "decode"):
        for backend in ("eager", "compile"):
            assert {f"llama_{phase}_{backend}_cpu{q}" for q in ("", "_int8", "_int4", "_8da4w")} <= set(planned)
        assert {f"llama_{phase}_executorch_cpu", f"llama_{phase}_executorch_cpu_8da4w"} <= set(planned)
    for s in plan.skipped:
        assert s.reason.startswith(f"backend {s.variant.backend.name} cannot run model.quant={s.variant.model.quant}")
    et = {s.name: s.reason for s in plan.skipped if s.variant.backend.name == "executorch"}
    assert sorted(et) == [f"llama_{p}_executorch_cpu_{q}" for p in ("decode", "prefill") for q in ("int4", "int8")]
    assert all("(runs: none, 8da4w)" in r and "XNNPACK" in r for r in et.values())


def test_quant_names_and_export_keys():
    """The group names only the grouped modes, and only off its default; every quantisation is
    its own export, a group an int8 model ignores is no new variant."""
    plan = plan_of(
        backend="executorch,eager", phase="decode", **{"model.quant": "none,int8,8da4w", "model.quant_group": "32,64"}
    )
    assert names(plan) == [
        "llama_decode_executorch_cpu",
        "llama_decode_executorch_cpu_8da4w",
        "llama_decode_executorch_cpu_8da4wg64",
        "llama_decode_eager_cpu",
        "llama_decode_eager_cpu_int8",
        "llama_decode_eager_cpu_8da4w",
        "llama_decode_eager_cpu_8da4wg64",
    ]
    keys = [pv.export_key for pv in plan.variants]
    assert len(set(keys)) == len(keys)
    assert {pv.bench.model.quant_group for pv in plan.variants if pv.bench.model.quant in ("none", "int8")} == {32}


def test_a_module_without_quants_runs_none_only(monkeypatch):
    from tasks.export.executorch import ExecutorchFormat

    monkeypatch.delattr(ExecutorchFormat, "QUANTS")  # the contract's default: a format makes none
    monkeypatch.delattr(ExecutorchFormat, "QUANT_NOTE")
    plan = plan_of(backend="executorch", phase="decode", **{"model.quant": "none,8da4w"})
    assert names(plan) == ["llama_decode_executorch_cpu"]
    (s,) = plan.skipped
    assert (
        s.name == "llama_decode_executorch_cpu_8da4w"
        and "(runs: none): tasks.export.executorch runs no quantised" in s.reason
    )


def test_quantised_executorch_needs_the_xnnpack_delegate_and_no_bfloat16():
    plan = plan_of(
        backend="executorch", phase="decode", **{"model.quant": "8da4w", "backend.export_options.delegate": "none"}
    )
    assert not plan.variants and "needs backend.export_options.delegate=xnnpack" in plan.skipped[0].reason
    plan = plan_of(backend="executorch", phase="decode", **{"model.quant": "none,8da4w", "model.dtype": "bfloat16"})
    assert names(plan) == ["llama_decode_executorch_cpu"]
    assert "model.quant=8da4w with model.dtype=bfloat16" in plan.skipped[0].reason


@pytest.mark.parametrize(
    ("axes", "message"),
    [
        ({"model.quant": "int3"}, "model.quant='int3' is not allowed; choose one of: none, int8, int4, 8da4w"),
        (
            {"model.quant": "int4", "model.quant_group": "48"},
            "model.quant_group=48 is not allowed; choose a positive multiple of 32",
        ),
        ({"model.quant": "8da4w", "model.quant_group": "0"}, "model.quant_group=0 is not allowed"),
        (
            {"model.quant": "int4", "model.quant_group": "128"},
            "model.quant_group=128 does not divide the model's hidden size 64",
        ),
    ],
)
def test_bad_quant_values_are_one_line_before_any_work(axes, message):
    with pytest.raises(ConfigError) as err:
        plan_of(**axes)
    assert message in str(err.value) and len(str(err.value).splitlines()) == 2  # "invalid config:" + the line


def test_quantised_parity_is_a_relative_error_bound():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(2, 1, 512)).astype(np.float32)
    near = ref + 0.05 * rng.normal(size=ref.shape).astype(np.float32)
    for actual, passes in ((near, True), (np.zeros_like(ref), False), (rng.normal(size=ref.shape), False)):
        report = summary([compare(actual, ref, 1e-4)], 1e-4)
        assert not report["passed"]  # the float tolerance: never for a quantised model's logits
        assert quantized(report, "int8")["passed"] is passes
    assert summary([compare(np.zeros_like(ref), ref)], 1e-4)["max_rel_error"] == pytest.approx(1.0)
    assert quantized({"max_rel_error": 0.3, "cache_max_rel_error": 0.9}, "int4")["passed"] is False
    assert QUANT_REL_ERROR["int8"] < QUANT_REL_ERROR["int4"] < 1.0  # weights zeroed err by 1.0


@pytest.mark.parametrize("quant", ["int8", "int4", "8da4w"])
def test_quantize_swaps_every_linear_weight_and_no_embedding(quant):
    import torch

    from tasks.model.quant import quantize

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 64), torch.nn.Linear(64, 96), torch.nn.Linear(96, 64))
    ids = torch.arange(8)[None]
    with torch.no_grad():
        ref = model(ids)
    counts = quantize(model, quant, 64)
    grouped = quant != "int8"  # 96 inputs are no multiple of a group of 64: that linear stays float
    assert counts == {"quantized_linears": 1 if grouped else 2, "float_linears": 1 if grouped else 0}
    assert type(model[0].weight) is torch.nn.Parameter and type(model[0].weight.data) is torch.Tensor
    assert type(model[1].weight.data) is not torch.Tensor  # a torchao tensor subclass
    with torch.no_grad():
        out = model(ids)
    err = float((out - ref).norm() / ref.norm())
    assert 0 < err < QUANT_REL_ERROR[quant]


# -- slow: exports and benchmarks of the tiny llama -------------------------------------------


def bench(planned_variant, *overrides):
    from tasks.jobs import bench_job

    export, spec = planned_variant(*overrides)
    return export, bench_job(spec)


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int8", "int4", "8da4w"])
def test_eager_quantised_decode_is_close_to_float(planned_variant, quant):
    _, result = bench(planned_variant, "model=llama", "phase=decode", "backend=eager", f"model.quant={quant}")
    assert result.ok, result.failure and result.failure.error
    p = result.parity
    assert p["steps"] == 8 and 0 < p["max_rel_error"] <= p["rel_error_bound"] == QUANT_REL_ERROR[quant]
    assert p["max_abs_diff"] > p["atol"]  # quantised indeed: the float tolerance would fail it


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["static", "update_cache"])
def test_executorch_8da4w_decodes_many_steps_with_xnnpack_quantised_linears(planned_variant, kv_cache):
    base = ["model=llama", "phase=decode", "backend=executorch", f"model.kv_cache={kv_cache}"]
    export, result = bench(planned_variant, *base, "model.quant=8da4w")
    assert result.ok, result.failure and result.failure.error
    assert result.parity["steps"] == 8 and result.parity["max_rel_error"] > 0
    d, anatomy = export.details, export.anatomy
    assert d["quantized_linears"] == 2 * 7 + 1 and d["float_linears"] == 0  # q, k, v, o, gate, up, down; lm_head
    outside = anatomy["outside_delegates"]  # torchao's quant ops and every linear run by XNNPACK
    assert not [op for op in outside if op.startswith("torchao.") or op in ("aten.linear", "aten.mm", "aten.addmm")]
    inside = {op for part in anatomy["partitions"] for op in part["ops"]}
    assert {"torchao.choose_qparams_affine", "torchao.dequantize_affine"} <= inside
    assert anatomy["constant_bytes"] < 0.6 * 4 * d["parameters"]  # the float32 weights' bytes


@pytest.mark.slow
def test_a_broken_quantisation_fails_parity(planned_variant, monkeypatch):
    """Weights zeroed after quantising: the relative error is 1, far past every bound."""
    import torch

    from tasks.model import quant

    real = quant.quantize

    def zeroed(module, kind, group):
        counts = real(module, kind, group)
        for m in module.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(torch.zeros(m.weight.shape), requires_grad=False)
        return counts

    monkeypatch.setattr(quant, "quantize", zeroed)
    _, result = bench(planned_variant, "model=llama", "phase=decode", "backend=eager", "model.quant=int8")
    assert not result.ok and result.failure.stage == "parity"
    assert result.parity["max_rel_error"] == pytest.approx(1.0, abs=1e-3)
    assert "exceeds 0.1 for model.quant=int8" in result.failure.error
