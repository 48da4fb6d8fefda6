"""Planning: readable names, deduplicated exports, skipped variants with reasons."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from orchestrator.config import ConfigError
from orchestrator.plan import make_plan
from tests.conftest import CONF


def grid(**axes: str):
    """Compose the configs of a sweep the way `-m key=a,b ...` would: one per combination."""
    keys = list(axes)
    jobs = [
        [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        for combo in itertools.product(*(axes[k].split(",") for k in keys))
    ]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        configs = [compose("sweep", overrides=job) for job in jobs]
    GlobalHydra.instance().clear()
    return configs, jobs


def plan_of(**axes: str):
    return make_plan(*grid(**axes))


def names(plan):
    return [pv.name for pv in plan.variants]


def test_default_sweep_names():
    plan = plan_of(model="llama,phi3", phase="prefill,decode")
    assert names(plan) == [
        "llama_prefill_onnxruntime_cpu",
        "llama_decode_onnxruntime_cpu",
        "phi3_prefill_onnxruntime_cpu",
        "phi3_decode_onnxruntime_cpu",
    ]
    assert len(plan.exports) == 4 and not plan.skipped


def test_swept_context_lengths_get_their_own_names_and_prefill_is_planned_once():
    plan = plan_of(phase="prefill,decode", **{"phase.context_len": "128,512,2048"})
    assert names(plan) == [
        "llama_prefill_onnxruntime_cpu",
        "llama_decode_onnxruntime_cpu_ctx128",
        "llama_decode_onnxruntime_cpu_ctx512",
        "llama_decode_onnxruntime_cpu_ctx2048",
    ]
    prefill = plan.variants[0]
    assert prefill.jobs == [0, 1, 2]  # the three prefill jobs are one and the same variant


def test_backends_with_one_export_format_share_nothing_but_equal_work_shares_an_export():
    plan = plan_of(backend="eager,onnxruntime", phase="decode", **{"bench.min_iters": "20,50"})
    assert names(plan) == [
        "llama_decode_eager_cpu_min_iters20",
        "llama_decode_eager_cpu_min_iters50",
        "llama_decode_onnxruntime_cpu_min_iters20",
        "llama_decode_onnxruntime_cpu_min_iters50",
    ]
    # measurement options do not change the artifact: two exports serve four variants
    assert len(plan.exports) == 2
    assert {pv.export_key for pv in plan.variants} == set(plan.exports)


def test_export_key_changes_with_shapes_and_format_not_with_bench_options():
    a, b, c = (
        plan_of(phase="decode", **{"phase.context_len": "128,256"}).variants
        + plan_of(phase="decode", backend="eager").variants
    )
    assert a.export_key != b.export_key and a.export_key != c.export_key
    assert a.variant.bench_key != b.variant.bench_key


def test_unsupported_device_is_skipped_with_a_reason():
    configs, jobs = grid(device="cpu,cuda", **{"backend.devices": "[cpu]"})
    plan = make_plan(configs, jobs)
    assert names(plan) == ["llama_prefill_onnxruntime_cpu"]
    assert [(s.name, s.reason) for s in plan.skipped] == [
        ("llama_prefill_onnxruntime_cuda", "backend onnxruntime does not run on device=cuda (backend.devices: cpu)")
    ]


def test_every_invalid_job_is_reported_at_once():
    configs, jobs = grid(**{"phase.batch": "0,1,-3"})
    with pytest.raises(ConfigError) as err:
        make_plan(configs, jobs)
    text = str(err.value)
    assert "job #0 (phase.batch=0): phase.batch=0 must be >= 1" in text
    assert "job #2 (phase.batch=-3): phase.batch=-3 must be >= 1" in text
    assert "job #1" not in text


def test_params_are_the_flattened_variant_config():
    params = plan_of(phase="decode").variants[0].variant.params
    assert params["model.kv_cache"] == "static" and params["phase.context_len"] == 128
    assert params["phase.cache_len"] == 136  # resolved: context + parity steps
    assert params["model.arch.num_key_value_heads"] == 2 and params["backend.export_format"] == "onnx"


def test_executorch_on_cuda_is_skipped_not_crashed():
    plan = plan_of(backend="onnxruntime,executorch", device="cpu,cuda")
    assert names(plan) == [
        "llama_prefill_onnxruntime_cpu",
        "llama_prefill_onnxruntime_cuda",
        "llama_prefill_executorch_cpu",
    ]
    assert [(s.name, s.reason) for s in plan.skipped] == [
        ("llama_prefill_executorch_cuda", "backend executorch does not run on device=cuda (backend.devices: cpu)")
    ]


def test_swapped_modules_are_named_and_exported_separately():
    plan = plan_of(
        phase="decode",
        backend="onnxruntime,executorch",
        **{"model.kv_cache": "static,dynamic", "model.attention": "sdpa,math"},
    )
    assert "llama_decode_executorch_cpu_math_kvdynamic" in names(plan)
    assert "llama_decode_onnxruntime_cpu_sdpa_kvstatic" in names(plan)
    assert len(plan.variants) == len(plan.exports) == 8


def test_eager_and_compile_share_one_reference_export():
    plan = plan_of(backend="eager,compile")
    assert len(plan.variants) == 2 and len(plan.exports) == 1


def test_sweep_wide_groups_cannot_vary_within_one_sweep():
    with pytest.raises(ConfigError, match=r"tracking.\* must be the same for every job of a sweep"):
        plan_of(**{"tracking.experiment": "a,b"})


@pytest.mark.parametrize(
    "model,size,params", [("llama", "1b", 1_235_814_400), ("phi3", "mini", 3_821_079_552), ("llama", "tiny", None)]
)
def test_driver_estimates_weight_bytes_without_torch(model, size, params):
    """The driver sizes memory requests from the config: within 0.01% of the real count."""
    from orchestrator.variant import estimated_parameters

    v = plan_of(model=model, **{"model.size": size}).variants[0].variant
    if params:
        assert estimated_parameters(v.model.arch) == pytest.approx(params, rel=1e-4)
        assert v.weight_bytes == pytest.approx(4 * params, rel=1e-4)
    else:
        from tasks.models import build_model

        assert estimated_parameters(v.model.arch) == sum(p.numel() for p in build_model(v.model).parameters())
