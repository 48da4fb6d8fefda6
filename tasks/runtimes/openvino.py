"""OpenVINO on the CPU: the ONNX format's file (tasks/export/onnx.py), read by OpenVINO's ONNX
frontend and compiled for its CPU plugin (`ov.Core().compile_model`), run by one InferRequest.
Imports no torch.

How it is set, each recorded as a param:
  INFERENCE_NUM_THREADS      bench.threads (0: OpenVINO's default, every core)
  PERFORMANCE_HINT           LATENCY, one stream: one request at a time, as the harness calls it
  INFERENCE_PRECISION_HINT   the model's dtype: float32 -> f32 (the CPU plugin's default is bf16
                             where the CPU has bf16 instructions, which would change every logit);
                             float16 -> f16 where the plugin lists FP16, else f32
  DYNAMIC_QUANTIZATION_GROUP_SIZE  model.quant's activations: 0 (float) for int8 and int4, the
                             quant group for 8da4w (int8 activations per group, on the file's
                             4-bit MatMulNBits weights)
  ENABLE_CPU_PINNING         backend.options.cpu_pinning (null: the plugin's default, on with the
                             LATENCY hint; false where other compiled models or processes share
                             the cores: the stream's threads then move as the OS schedules them)

The file's inputs and outputs are read through the format's adapter (tasks/export/onnx_io.py).
The builder's graph (exporter=genai) is refused: OpenVINO 2026.4 reads its com.microsoft ops but
returned wrong logits for it (limits()).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.contract import Point, Runtime
from tasks.export.onnx_io import feeds_for, signature
from tasks.measure.profiles import WARMUP, add, top_ops
from tasks.measure.session import Session
from tasks.specs import BenchSpec

PRECISION = {"float32": "f32", "float16": "f16"}
# the CPU plugin's layer types in the compiled graph (get_runtime_model(), rt_info layerType):
# data movement by kind, and the fused or heavy ops whose counts show what the plugin made of the file
MOVEMENT = {"transposes": ("Transpose",), "copies": ("Reorder",), "casts": ("Convert",)}
FUSED = ("FullyConnected", "MatMul", "ScaledDotProductAttention", "RMS", "RoPE", "Subgraph")
NOT_OPS = ("Input", "Output", "Const")  # the runtime graph's ends and constants


@dataclass(frozen=True)
class Options:
    cpu_pinning: bool | None = None  # null: the CPU plugin's default (pinned with the LATENCY hint)


def plugin_params(compiled: Any) -> dict[str, Any]:
    """What config() set, as the compiled model reports it: the params both openvino runtimes record."""
    get = compiled.get_property
    return {
        "ov_inference_num_threads": get("INFERENCE_NUM_THREADS"),  # 0: OpenVINO's default (all cores)
        "ov_performance_hint": str(get("PERFORMANCE_HINT")).rsplit(".", 1)[-1],
        "ov_num_streams": int(get("NUM_STREAMS")),
        "ov_inference_precision": get("INFERENCE_PRECISION_HINT").to_string(),
        "ov_dynamic_quantization_group_size": get("DYNAMIC_QUANTIZATION_GROUP_SIZE"),
        "ov_cpu_pinning": get("ENABLE_CPU_PINNING"),
    }


def config(spec: BenchSpec, capabilities: list[str], cpu_pinning: bool | None = None) -> dict[str, Any]:
    """The CPU plugin's properties for this benchmark (OpenVINO's string keys and values)."""
    precision = PRECISION[spec.model.dtype]
    if precision == "f16" and "FP16" not in capabilities:
        precision = "f32"  # no f16 arithmetic on this CPU: the plugin would upcast anyway
    quant = spec.model.quant
    pinning = {} if cpu_pinning is None else {"ENABLE_CPU_PINNING": cpu_pinning}
    return {
        "INFERENCE_NUM_THREADS": spec.bench.threads or 0,
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": precision,
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": spec.model.quant_group if quant == "8da4w" else 0,
        **pinning,
    }


def graph_counts(runtime_model: Any) -> dict[str, int]:
    """{layer type: count} of the compiled graph, constants and its ends left out."""
    counts: Counter = Counter()
    for op in runtime_model.get_ordered_ops():
        kind = op.get_rt_info()["layerType"].astype(str)
        if kind not in NOT_OPS:
            counts[kind] += 1
    return dict(counts)


def anatomy_metrics(counts: dict[str, int]) -> dict[str, float]:
    """ov_graph_* metrics: its nodes, movement by kind, and FUSED's counts."""
    out = {"ov_graph_nodes": float(sum(counts.values()))}
    for kind, types in MOVEMENT.items():
        out[f"ov_graph_{kind}"] = float(sum(counts.get(t, 0) for t in types))
    for kind in FUSED:
        out[f"ov_graph_{kind}"] = float(counts.get(kind, 0))
    return out


class OvSession(Session):
    def __init__(self, path: Path, spec: BenchSpec, meta: dict[str, Any]):
        # lazy: openvino, only in a job's process
        import openvino as ov

        if spec.device != "cpu":
            raise RuntimeError(f"device={spec.device}: the openvino backend runs on cpu only")
        self.core = ov.Core()
        pinning = Options(**spec.runtime_options).cpu_pinning
        self.config = config(spec, list(self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")), pinning)
        self.path = path
        self.compiled = self.core.compile_model(self.core.read_model(str(path)), "CPU", self.config)
        self.request = self.compiled.create_infer_request()
        self.feeds = feeds_for(signature(path), meta)  # the phase's feeds -> this file's inputs
        self.output_names = self.feeds.output_names
        self.inputs = [i.get_any_name() for i in self.compiled.inputs]
        self.metrics = anatomy_metrics(graph_counts(self.compiled.get_runtime_model()))
        self.info = plugin_params(self.compiled)

    def _set(self, request: Any, feeds: dict[str, np.ndarray]) -> None:
        # lazy: openvino, only in a job's process
        import openvino as ov

        host = self.feeds.host(feeds)
        for name in self.inputs:
            request.set_tensor(name, ov.Tensor(np.ascontiguousarray(host[name])))

    def _outputs(self, request: Any) -> list[np.ndarray]:
        """Copies: the request's output memory is the next call's."""
        return [request.get_tensor(name).data.copy() for name in self.output_names]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self._set(self.request, feeds)
        self.request.infer()
        return self._outputs(self.request)

    def bind(self, feeds: dict[str, np.ndarray]):
        """Inputs set on the request once; each call runs it, its outputs left where they are."""
        self._set(self.request, feeds)
        request = self.request
        return lambda: request.infer(share_outputs=True)

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """Layers by type, from OpenVINO's performance counters (PERF_COUNT) of a second compiled
        model with the same settings, read after each call (they hold the last call's)."""
        compiled = self.core.compile_model(self.core.read_model(str(self.path)), "CPU", {**self.config, "PERF_COUNT": True})
        request = compiled.create_infer_request()
        self._set(request, feeds)
        for _ in range(WARMUP):
            request.infer()
        per_op: dict[str, tuple[int, float]] = {}
        call_us = 0.0
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            request.infer()
            call_us += (time.perf_counter_ns() - t0) / 1e3
            profile_layers(request.get_profiling_info(), per_op)
        # a layer type under the counters' 1 us tick on every call has no time to report
        return top_ops({op: v for op, v in per_op.items() if v[1] > 0}, calls, call_us)


def profile_layers(infos: list[Any], per_op: dict[str, tuple[int, float]]) -> None:
    """One call's counters into `per_op` by layer type, real time in us. The counters tick in
    whole microseconds and mark a layer that took less NOT_RUN, so a layer counts as executed
    when marked so or when it names its kernel (jit_avx512_f32); the rest (an in-place Reshape,
    the graph's ends) ran nothing."""
    for info in infos:
        if str(info.status).endswith(".EXECUTED") or not info.exec_type.startswith(("unknown", "undef")):
            add(per_op, info.node_type, info.real_time.total_seconds() * 1e6)


class OpenvinoRuntime(Runtime):
    Options = Options
    LIBRARIES = ("openvino",)
    REQUIRES = ("openvino",)
    PRELOAD = ("openvino", "onnx")  # onnx reads the file's inputs and outputs
    DTYPES = {"cpu": ("float32", "float16")}
    DTYPE_NOTE = "OpenVINO's CPU plugin runs bfloat16 as an inference precision, not as a file's inputs numpy can feed"
    # model.quant: the file's MatMulNBits (tasks/export/_onnx_quant.py), which OpenVINO's ONNX
    # frontend reads as compressed weights of its FullyConnected layers
    QUANTS = {"cpu": ("none", "int8", "int4", "8da4w")}
    PROFILER = "OpenVINO's performance counters (PERF_COUNT, get_profiling_info), in a compiled model of its own"

    def limits(self, point: Point) -> str | None:
        if point.export_options.get("exporter") == "genai":
            return (
                f"backend {point.backend} cannot run backend.export_options.exporter=genai: OpenVINO's ONNX frontend "
                "reads the builder's GroupQueryAttention, but its logits came back with batch 0"
            )
        return None

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> OvSession:
        return OvSession(Path(spec.export_dir) / meta["artifact"], spec, meta)


RUNTIME = OpenvinoRuntime()
