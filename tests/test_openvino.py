"""backend=openvino (tasks/runtimes/openvino.py): the ONNX format's file run by OpenVINO's CPU
plugin. The plan (names, the shared export, what it refuses, a missing extra), the plugin's
settings and its counters' table are fast; a real benchmark of each phase is slow."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from types import SimpleNamespace

import pytest

from tasks.measure.profiles import top_ops
from tasks.runtimes import openvino as ov_runtime
from tasks.specs import ConfigError
from tests.conftest import DECODE, FAST_BENCH, model_spec, plan_jobs


def test_it_exports_standard_ops_and_names_its_variants():
    jobs = [[f"backend={b}", f"phase={p}", f"model.quant={q}"] for b in ("onnxruntime", "openvino")
            for p in ("prefill", "decode") for q in ("none", "int4")]
    plan = plan_jobs(*jobs)
    names = {pv.name for pv in plan.variants}
    assert {"llama_decode_openvino_cpu_int4", "llama_prefill_openvino_cpu", "llama_decode_onnxruntime_cpu_int4"} <= names
    assert not plan.skipped and len(plan.variants) == 8
    # one ONNX file per phase, quant and runtime: onnxruntime's holds ONNX Runtime's contrib ops
    # (backend.export_options.ort_fusions), which OpenVINO's ONNX frontend does not all read
    assert len(plan.exports) == 8
    assert {pv.bench.runtime for pv in plan.variants if "_openvino_" in pv.name} == {"openvino"}


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["model.dtype=bfloat16"], "backend openvino does not run model.dtype=bfloat16 on device=cpu (runs: float32, float16)"),
        (["backend.export_options.exporter=genai"], "backend openvino cannot run backend.export_options.exporter=genai"),
        (["model.kv_cache=update_cache"], "backend openvino cannot run model.kv_cache=update_cache: ONNX has no llama::update_cache"),
    ],
)
def test_what_it_cannot_run_is_planned_as_skipped_with_the_reason(overrides, reason):
    plan = plan_jobs(["backend=openvino", "phase=decode", *overrides])
    assert not plan.variants and plan.skipped[0].reason.startswith(reason), plan.skipped


def test_device_cuda_is_not_one_of_its_devices():
    plan = plan_jobs(["backend=openvino", "device=cuda"])
    assert not plan.variants
    assert [s.reason for s in plan.skipped] == ["backend openvino does not run on device=cuda (backend.devices: cpu)"]


def test_without_its_extra_the_point_is_skipped_with_the_install(monkeypatch):
    monkeypatch.setattr("tasks.contract.installed", lambda distribution: distribution != "openvino")
    plan = plan_jobs(["backend=openvino", "phase=prefill"], ["backend=openvino", "phase=decode"])
    assert not plan.variants
    assert {s.reason for s in plan.skipped} == {"backend openvino needs openvino, not installed: pip install openvino"}


def _spec(**model):
    return SimpleNamespace(model=model_spec("llama", **model), bench=dataclasses.replace(FAST_BENCH, threads=2), phase=DECODE)


def test_the_plugin_is_set_from_the_benchmark_and_the_model():
    fp32 = ov_runtime.config(_spec(), ["FP32", "BF16"])
    assert fp32 == {
        "INFERENCE_NUM_THREADS": 2,
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": "f32",  # never the plugin's bf16 default on a bf16 CPU
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    assert ov_runtime.config(_spec(dtype="float16"), ["FP32", "FP16"])["INFERENCE_PRECISION_HINT"] == "f16"
    assert ov_runtime.config(_spec(dtype="float16"), ["FP32", "BF16"])["INFERENCE_PRECISION_HINT"] == "f32"
    assert ov_runtime.config(_spec(quant="int4"), [])["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0  # float activations
    assert ov_runtime.config(_spec(quant="8da4w", quant_group=64), [])["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 64
    # CPU pinning only when backend.options.cpu_pinning names it: null leaves the plugin's default
    assert ov_runtime.config(_spec(), [], cpu_pinning=False)["ENABLE_CPU_PINNING"] is False
    assert ov_runtime.config(_spec(), [], cpu_pinning=True)["ENABLE_CPU_PINNING"] is True


@pytest.mark.parametrize("backend", ["openvino", "openvino_optimum"])
def test_cpu_pinning_is_a_typed_option_of_both_openvino_backends(backend):
    plan = plan_jobs([f"backend={backend}", "phase=decode", "backend.options.cpu_pinning=false"])
    assert [pv.bench.runtime_options["cpu_pinning"] for pv in plan.variants] == [False]
    with pytest.raises(ConfigError, match=r"backend.options.cpu_pinning='maybe'"):
        plan_jobs([f"backend={backend}", "phase=decode", "backend.options.cpu_pinning=maybe"])


def _info(kind: str, us: int, status: str = "Status.EXECUTED", exec_type: str = "jit_avx512_f32"):
    return SimpleNamespace(node_type=kind, real_time=timedelta(microseconds=us), status=status, exec_type=exec_type)


def test_its_counters_make_the_common_profile_table():
    """Two calls: a layer under a microsecond reads NOT_RUN yet names its kernel (it ran); an
    in-place Reshape and the graph's ends ran nothing."""
    per_op: dict = {}
    for _ in range(2):
        ov_runtime.profile_layers(
            [
                _info("FullyConnected", 30),
                _info("RMS", 0, "Status.NOT_RUN"),
                _info("Reshape", 0, "Status.NOT_RUN", "unknown_f32"),
                _info("Parameter", 0, "Status.NOT_RUN", "unknown_i64"),
                _info("Transpose", 2, "Status.EXECUTED", "unknown_f32"),
            ],
            per_op,
        )
    assert per_op == {"FullyConnected": (2, 60.0), "RMS": (2, 0.0), "Transpose": (2, 4.0)}
    rows = top_ops(per_op, calls=2, call_us=80.0)
    assert [(r["op"], r["per_call"], r["us_per_call"]) for r in rows] == [
        ("FullyConnected", 1.0, 30.0),
        ("Transpose", 1.0, 2.0),
        ("RMS", 1.0, 0.0),
        ("(outside ops)", 0.0, 8.0),
    ]


def test_the_compiled_graphs_anatomy_counts_movement_and_fused_layers():
    counts = {"FullyConnected": 15, "RoPE": 4, "Transpose": 3, "Reorder": 2, "Convert": 1, "Eltwise": 5}
    m = ov_runtime.anatomy_metrics(counts)
    assert m["ov_graph_nodes"] == 30 and m["ov_graph_transposes"] == 3 and m["ov_graph_copies"] == 2
    assert m["ov_graph_casts"] == 1 and m["ov_graph_FullyConnected"] == 15 and m["ov_graph_ScaledDotProductAttention"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "quant"), [("prefill", "none"), ("decode", "none"), ("decode", "int4")])
def test_it_runs_the_onnx_file_with_parity_quality_and_a_profile(planned_variant, phase, quant):
    pytest.importorskip("openvino", reason="pip install -e '.[openvino]'")
    from tasks.jobs import bench_job

    _, spec = planned_variant("backend=openvino", f"phase={phase}", f"model.quant={quant}", "backend.options.cpu_pinning=false")
    result = bench_job(dataclasses.replace(spec, bench=dataclasses.replace(spec.bench, profile=True)))
    assert result.ok, result.failure and result.failure.traceback
    assert result.parity["passed"] and result.metrics["parity_steps"] == (1 if phase == "prefill" else DECODE.parity_steps)
    assert result.params["ov_inference_num_threads"] == FAST_BENCH.threads
    assert result.params["ov_inference_precision"] == "f32" and result.params["ov_performance_hint"] == "LATENCY"
    assert result.params["ov_cpu_pinning"] is False
    assert result.metrics["ov_graph_FullyConnected"] > 0 and result.metrics["latency_ms_median"] > 0
    if quant != "none":  # measured against float32 eager
        assert 0 <= result.metrics["quality_kl"] and 0 <= result.metrics["quality_top1"] <= 1
    ops = {row["op"] for row in result.profile}  # FullyConnectedCompressed on 4-bit weights
    assert any(op.startswith("FullyConnected") for op in ops) and all(row["us_per_call"] >= 0 for row in result.profile)
