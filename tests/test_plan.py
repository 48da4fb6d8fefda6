"""Planning, without Ray: readable names, deduplicated exports, skipped variants with
reasons, every job's spec and resources resolved against a given capacity, and a plan
that nothing can change once made."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import open_dict

from orchestrator.plan.compose import JobConfigs
from orchestrator.plan.config import ConfigError, validate_all
from orchestrator.plan.placement import Capacity
from orchestrator.plan.planner import make_plan
from tasks.phases import decode
from tests.conftest import CONF, ROOT

GiB = 2**30
CAPACITY = Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=0, memory=8 * GiB)


def grid(**axes: str):
    """Compose the configs of a sweep the way `-m key=a,b ...` does: one per combination, by the
    launcher's JobConfigs (Hydra composes each combination of groups once, at most)."""
    keys = list(axes)
    jobs = [
        [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        for combo in itertools.product(*(axes[k].split(",") for k in keys))
    ]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        configs = list(JobConfigs(loader, loader.load_configuration("sweep", [], RunMode.MULTIRUN), jobs))
    GlobalHydra.instance().clear()
    return configs, jobs


def plan_grid(configs, jobs, capacity: Capacity = CAPACITY):
    return make_plan(validate_all(configs, jobs), configs, jobs, capacity)


def plan_of(capacity: Capacity = CAPACITY, **axes: str):
    return plan_grid(*grid(**axes), capacity=capacity)


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
    assert prefill.jobs == (0, 1, 2)  # the three prefill jobs are one and the same variant
    assert [pv.jobs for pv in plan.variants[1:]] == [(3,), (4,), (5,)]


def test_parity_steps_swept_over_decode_share_one_timed_shape():
    """Parity steps change what is checked, not what is timed: the static cache stays
    context_len + HEADROOM, so the variants differ in name and export but not in shape."""
    plan = plan_of(phase="decode", **{"phase.parity_steps": "2,8"})
    assert names(plan) == ["llama_decode_onnxruntime_cpu_parity_steps2", "llama_decode_onnxruntime_cpu_parity_steps8"]
    assert {pv.bench.phase.cache_len for pv in plan.variants} == {128 + decode.HEADROOM}


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
    d, e = plan_of(phase="decode", **{"bench.min_iters": "20,50"}).variants
    assert d.export_key == e.export_key == a.export_key and d.variant.bench_key != e.variant.bench_key


def test_runtime_options_change_the_bench_key_not_the_export():
    a, b = plan_of(**{"backend.options.graph_optimization_level": "all,basic"}).variants
    assert a.export_key == b.export_key and a.variant.bench_key != b.variant.bench_key
    assert (a.bench.runtime_options, b.bench.runtime_options) == (
        {"graph_optimization_level": "all", "intra_op_spinning": True},
        {"graph_optimization_level": "basic", "intra_op_spinning": True},
    )
    c, d = plan_of(**{"backend.export_options.optimize": "true,false"}).variants
    assert c.export_key != d.export_key


def test_unsupported_device_is_skipped_with_a_reason():
    plan = plan_of(device="cpu,cuda", **{"backend.devices": "[cpu]"})
    assert names(plan) == ["llama_prefill_onnxruntime_cpu"]
    assert [(s.name, s.reason) for s in plan.skipped] == [
        ("llama_prefill_onnxruntime_cuda", "backend onnxruntime does not run on device=cuda (backend.devices: cpu)")
    ]
    assert plan.skipped[0].job == 1 and plan.skipped[0].key == "llama_prefill_onnxruntime_cuda (job #1)"


def test_every_invalid_job_is_reported_at_once_each_message_once():
    configs, jobs = grid(**{"phase.batch": "0,1,-3"})
    with pytest.raises(ConfigError) as err:
        validate_all(configs, jobs)
    text = str(err.value)
    assert text.count("phase.batch=0 must be >= 1") == 1 and text.count("phase.batch=-3 must be >= 1") == 1
    assert "phase.batch=0 must be >= 1  [1 of 3 jobs: #0 (phase.batch=0)]" in text
    assert "phase.batch=-3 must be >= 1  [1 of 3 jobs: #2 (phase.batch=-3)]" in text
    assert "#1" not in text


def test_one_bad_value_over_a_large_grid_is_one_line():
    """50 jobs sharing one bad value: the message once, with how many jobs it affects."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        base = compose("sweep", overrides=["model.kv_cache=paged"])  # compose once, vary the copies
    GlobalHydra.instance().clear()
    configs, jobs = [], []
    for batch in range(1, 51):
        cfg = base.copy()
        with open_dict(cfg):
            cfg.phase.batch = batch
        configs.append(cfg)
        jobs.append(["model.kv_cache=paged", f"phase.batch={batch}"])
    with pytest.raises(ConfigError) as err:
        validate_all(configs, jobs)
    text = str(err.value)
    assert text.count("model.kv_cache='paged' is not allowed; choose one of: static, dynamic") == 1
    assert "[50 of 50 jobs: #0 (model.kv_cache=paged phase.batch=1)" in text and "and 47 more]" in text
    assert len(text.splitlines()) == 2  # "invalid config:" and the one message


def test_params_are_the_flattened_variant_config():
    params = plan_of(phase="decode").variants[0].variant.params
    assert params["model.kv_cache"] == "static" and params["phase.context_len"] == 128
    assert params["phase.cache_len"] == 128 + decode.HEADROOM  # resolved: context + headroom
    assert params["model.arch.num_key_value_heads"] == 2 and params["backend.export_format"] == "onnx"
    assert params["backend.runtime"] == "onnxruntime" and params["backend.options.graph_optimization_level"] == "all"
    assert params["bench.threads"] == 2  # resolved against the capacity


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
    (job,) = plan.exports.values()
    assert job.variants == ("llama_prefill_eager_cpu", "llama_prefill_compile_cpu")
    assert job.spec.export_format == "none" and job.spec.options == {}
    assert [pv.bench.runtime for pv in plan.variants] == ["eager", "compile"]


def test_sweep_wide_groups_cannot_vary_within_one_sweep():
    with pytest.raises(ConfigError, match=r"tracking.\* must be the same for every job of a sweep"):
        plan_of(**{"tracking.experiment": "a,b"})


# -- the plan is final when made ------------------------------------------------------


@pytest.fixture(scope="module")
def big_plan():
    return plan_of(
        model="llama,phi3", phase="prefill,decode", backend="eager,compile,onnxruntime,executorch", device="cpu,cuda"
    )


def test_plan_is_frozen(big_plan):
    pv = big_plan.variants[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        pv.name = "renamed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        pv.bench = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        pv.bench.variant = "renamed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        pv.variant.bench.threads = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        next(iter(big_plan.exports.values())).variants = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        big_plan.skipped[0].reason = "changed"
    assert isinstance(big_plan.variants, tuple) and isinstance(big_plan.skipped, tuple)


def test_every_bench_spec_is_resolved(big_plan):
    """Threads, runtime, options and the export entry are in the spec when planned."""
    assert len(big_plan.variants) == 28 and len(big_plan.skipped) == 4 and len(big_plan.exports) == 12
    for pv in big_plan.variants:
        b = pv.bench
        assert b.variant == pv.name and b.device == pv.variant.device.name
        assert b.runtime == pv.variant.backend.runtime == pv.variant.backend.name
        assert b.runtime_options == pv.variant.backend.options
        assert b.phase == pv.variant.phase and b.model == pv.variant.model
        assert b.export_dir == big_plan.exports[pv.export_key].spec.out_dir
        if b.device == "cpu":  # bench.threads: null in the config -> every core of a bench node
            assert b.bench.threads == pv.variant.bench.threads == 2
            assert pv.request.pool == "bench_cpu" and pv.request.options["num_cpus"] == 2
        else:
            assert b.bench.threads == 1 and pv.request.pool == "gpu"


def test_lookup_by_name_and_export_users(big_plan):
    for pv in big_plan.variants:
        assert big_plan.variant(pv.name) is pv
    with pytest.raises(KeyError):
        big_plan.variant("nope")
    served = [name for job in big_plan.exports.values() for name in job.variants]
    assert sorted(served) == sorted(names(big_plan))  # every variant served by exactly one export
    for key, job in big_plan.exports.items():
        assert job.spec.key == key
        assert all(big_plan.variant(name).export_key == key for name in job.variants)
        users = big_plan.variant(job.variants[0]).variant
        assert job.spec.export_format == users.backend.export_format
        assert job.request.pool == "cpu" and job.request.options["num_cpus"] == 1
    compile_ = big_plan.exports[big_plan.variant("phi3_decode_compile_cpu").export_key]
    assert compile_.variants == (
        "phi3_decode_eager_cpu",
        "phi3_decode_eager_cuda",
        "phi3_decode_compile_cpu",
        "phi3_decode_compile_cuda",
    )


def test_cuda_without_a_gpu_is_unplaceable(big_plan):
    for pv in big_plan.variants:
        if pv.variant.device.name == "cuda":
            assert "no node of this Ray cluster has one" in pv.unplaceable
        else:
            assert pv.unplaceable is None and pv.warning is None
    with_gpu = plan_of(Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=1, memory=8 * GiB), device="cuda")
    (pv,) = with_gpu.variants
    assert pv.unplaceable is None and pv.request.pool == "gpu" and pv.request.options["num_gpus"] == 1


def test_weights_larger_than_any_node_are_unplaceable():
    plan = plan_of(model="phi3", **{"model.size": "mini"})  # 3.8 B parameters in fp32: 14 GiB > 8 GiB
    (pv,) = plan.variants
    assert "GiB of weights exceed the 8.0 GiB of memory the largest node offers Ray" in pv.unplaceable
    assert "may not fit" in pv.warning
    assert pv.request.options["memory"] == 8 * GiB  # capped at a node: it then runs alone there
    small = plan_of(model="llama", **{"model.size": "1b"}).variants[0]  # 4.6 GiB: fits
    assert small.unplaceable is None


def test_more_threads_than_a_bench_node_has_is_refused_when_planning():
    with pytest.raises(ConfigError, match="bench.threads=8 exceeds the 2 CPUs of the smallest benchmark node"):
        plan_of(**{"bench.threads": "8"})
    (pv,) = plan_of(**{"bench.threads": "1"}).variants
    # one thread, but the whole node reserved: nothing else of ours runs on its other cores
    assert pv.bench.bench.threads == 1 and pv.request.options["num_cpus"] == 2


@pytest.mark.parametrize(
    "model,size,params", [("llama", "1b", 1_235_814_400), ("phi3", "mini", 3_821_079_552), ("llama", "tiny", None)]
)
def test_driver_estimates_weight_bytes_without_torch(model, size, params):
    """The driver sizes memory requests from the config: within 0.01% of the real count."""
    from tasks.model.families import estimated_parameters

    v = plan_of(model=model, **{"model.size": size}).variants[0].variant
    if params:
        assert estimated_parameters(v.model.family, v.model.arch) == pytest.approx(params, rel=1e-4)
        assert v.weight_bytes == pytest.approx(4 * params, rel=1e-4)
    else:
        from tasks.model.models import build_model

        assert estimated_parameters(v.model.family, v.model.arch) == sum(p.numel() for p in build_model(v.model).parameters())


def test_a_skipped_dtype_twin_gets_its_own_name_and_equal_skipped_work_is_one():
    """ONNX Runtime has no bfloat16 on CPU: that point is skipped, named with the others
    (it is recorded, so it may not share the float32 variant's name); prefill ignores the
    swept context length, so its skipped points are one, as its run variants are."""
    plan = plan_of(
        backend="onnxruntime",
        phase="prefill,decode",
        **{"model.dtype": "float32,bfloat16", "phase.context_len": "64,128"},
    )
    assert names(plan) == [
        "llama_prefill_onnxruntime_cpu_fp32",
        "llama_decode_onnxruntime_cpu_fp32_ctx64",
        "llama_decode_onnxruntime_cpu_fp32_ctx128",
    ]
    assert [s.name for s in plan.skipped] == [
        "llama_prefill_onnxruntime_cpu_bf16",
        "llama_decode_onnxruntime_cpu_bf16_ctx64",
        "llama_decode_onnxruntime_cpu_bf16_ctx128",
    ]
    assert all("bfloat16" in s.reason for s in plan.skipped)
    assert not set(names(plan)) & {s.name for s in plan.skipped}


def test_export_keys_cover_the_tasks_source(tmp_path, monkeypatch):
    """The export key hashes every file of tasks/ (a change there is a new export), not an empty folder."""
    from orchestrator.plan import variant

    assert variant.TASKS_DIR == ROOT / "tasks" and any(variant.TASKS_DIR.rglob("*.py"))
    here = variant._tasks_source_hash()
    copy = tmp_path / "tasks"
    for path in variant.TASKS_DIR.rglob("*.py"):
        (copy / path.relative_to(variant.TASKS_DIR)).parent.mkdir(parents=True, exist_ok=True)
        (copy / path.relative_to(variant.TASKS_DIR)).write_bytes(path.read_bytes())
    monkeypatch.setattr(variant, "TASKS_DIR", copy)
    variant._tasks_source_hash.cache_clear()
    assert variant._tasks_source_hash() == here
    (copy / "jobs.py").write_text((copy / "jobs.py").read_text() + "\n# changed\n")
    variant._tasks_source_hash.cache_clear()
    assert variant._tasks_source_hash() != here
    variant._tasks_source_hash.cache_clear()


def test_an_export_key_is_the_digest_of_its_whole_identity():
    """Export keys made from their parts' JSON texts (once per part, in a plan's memo) are the
    digest of the whole identity as one json.dumps writes it: export caches stay valid."""
    from orchestrator.plan import variant
    from tasks.export import format_module

    plan = plan_of(model="llama,phi3", phase="decode", backend="eager,onnxruntime,executorch")
    for pv in plan.variants:
        v = pv.variant
        model = dataclasses.asdict(v.model)
        model.pop("name")
        model["checkpoint"] = variant._checkpoint_identity(v.model.checkpoint, v.model.revision)
        fmt = v.backend.export_format
        whole = {
            "model": model,
            "phase": dataclasses.asdict(v.phase),
            "format": fmt,
            "options": v.backend.export_options,
            "quality": variant._quality_identity(v.quality),
            "versions": {lib: variant._version(lib) for lib in format_module(fmt).LIBRARIES},
            "tasks": variant._tasks_source_hash(),
        }
        assert pv.export_key == variant._digest(whole) == dataclasses.replace(v).export_key, pv.name
