"""OpenVINO on the CPU running the stateful IR optimum-intel makes (tasks/export/openvino_ir.py):
its KV cache is OpenVINO state inside the compiled model, which one InferRequest keeps between
calls. Imports no torch.

A call feeds input_ids [B, n], attention_mask [B, start + n] (ones), position_ids [B, n]
(start..start+n-1) and beam_idx [B] (0..B-1: each row keeps its own cache), and the state must
hold exactly the `start` positions before it:
  prefill  the prompt's P tokens at 0..P-1: reset_state() then one infer, both in the timed call
           (a new sequence starts with an empty state)
  decode   one token at position C, after the context's C tokens were run once into the state
           (the phase's CONTEXT feed); each call appends its position to the state, so before each
           timed call the state is set back to the C positions saved after the context (untimed:
           the session's timer() runs it before starting the clock), and every timed call sees
           the same depth
Parity steps through the IR's own state (run_steps): consecutive calls, nothing set back.
A call at a position below the state's depth (a new window of the quality inputs) trims the
state to it, as openvino_genai does between generations.

How it is set, each recorded as a param: tasks/runtimes/openvino.py's config() (threads, the
LATENCY hint with one stream, the inference precision, dynamic quantisation of activations for
8da4w), and KV_CACHE_PRECISION from backend.options.kv_cache_precision (auto: f32 for a float32
model; the CPU plugin's own default compresses the cache to u8 on x86, which moves the logits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.contract import Runtime
from tasks.measure.profiles import WARMUP, top_ops
from tasks.measure.session import Session
from tasks.runtimes.openvino import anatomy_metrics, config, graph_counts, profile_layers
from tasks.specs import CONTEXT, BenchSpec, choice

KV_PRECISIONS = ("auto", "f32", "f16", "u8")
SEQ_AXIS = 2  # the state's layout: [B, H_kv, seq, D]


@dataclass(frozen=True)
class Options:
    kv_cache_precision: str = "auto"  # auto: f32 for a float32 model | f32 | f16 | u8 (the plugin's x86 default)

    def __post_init__(self) -> None:
        choice("backend.options.kv_cache_precision", self.kv_cache_precision, KV_PRECISIONS)


def stateful_config(spec: BenchSpec, capabilities: list[str]) -> dict[str, Any]:
    precision = Options(**spec.runtime_options).kv_cache_precision
    if precision == "auto":
        precision = "f32" if spec.model.dtype == "float32" else "f16"
    return {**config(spec, capabilities), "KV_CACHE_PRECISION": precision}


class Bound:
    """One call on the request; `rewind()`, untimed before each call (StatefulSession.timer), sets
    its inputs on the request (a parity step in between set others) and the state back to the
    `start` positions it held when bound."""

    def __init__(self, engine: Engine, feeds: dict[str, np.ndarray], start: int):
        import openvino as ov  # lazy: openvino, only in a job's process

        self.engine, self.start = engine, start
        self.snapshot = [(s, ov.Tensor(s.state.data.copy())) for s in engine.request.query_state()] if start else []
        self.tensors = {name: ov.Tensor(np.ascontiguousarray(array)) for name, array in feeds.items()}

    def rewind(self) -> None:
        request = self.engine.request
        for name, tensor in self.tensors.items():
            request.set_tensor(name, tensor)
        for state, saved in self.snapshot:
            state.state = saved

    def __call__(self) -> None:
        request = self.engine.request
        if self.start == 0:
            request.reset_state()
        request.infer()


class Engine:
    """A compiled stateful model, its one request, and the depth its state holds."""

    def __init__(self, core: Any, path: Path, settings: dict[str, Any]):
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", settings)
        self.request = self.compiled.create_infer_request()
        self.depth = 0

    @staticmethod
    def feeds(ids: np.ndarray, start: int) -> dict[str, np.ndarray]:
        rows, n = ids.shape
        return {
            "input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((rows, start + n), dtype=np.int64),
            "position_ids": np.broadcast_to(np.arange(start, start + n, dtype=np.int64), (rows, n)),
            "beam_idx": np.arange(rows, dtype=np.int32),
        }

    def seek(self, start: int) -> None:
        """The state holding positions 0..start-1 of what it held."""
        if start == 0:
            self.request.reset_state()
        elif start < self.depth:
            import openvino as ov  # lazy: openvino, only in a job's process

            for state in self.request.query_state():
                state.state = ov.Tensor(np.ascontiguousarray(np.take(state.state.data, range(start), axis=SEQ_AXIS)))
        elif start > self.depth:
            raise RuntimeError(f"a call at position {start}: the IR's state holds {self.depth} positions, not those before it")
        self.depth = start

    def call(self, ids: np.ndarray, start: int) -> np.ndarray:
        """Tokens [B, n] at positions start..: each row's last logits [B, 1, V] (float32, a copy)."""
        self.seek(start)
        self.request.infer(self.feeds(ids, start))
        self.depth = start + ids.shape[1]
        return self.request.get_tensor("logits").data[:, -1:].astype(np.float32)

    def bind(self, inputs: dict[str, np.ndarray]) -> Bound:
        ids, start = np.asarray(inputs["input_ids"]), int(inputs["cache_position"][0])
        self.seek(start)
        bound = Bound(self, self.feeds(ids, start), start)
        self.depth = start + ids.shape[1]
        return bound

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The context's tokens run into the state (one call at 0..C-1); the call's own inputs."""
        if CONTEXT in feeds:
            self.call(np.asarray(feeds[CONTEXT]), 0)
        return {n: a for n, a in feeds.items() if n != CONTEXT}


class StatefulSession(Session):
    def __init__(self, path: Path, spec: BenchSpec):
        import openvino as ov  # lazy: openvino, only in a job's process

        if spec.device != "cpu":
            raise RuntimeError(f"device={spec.device}: the openvino_stateful runtime runs on cpu only")
        self.core, self.path = ov.Core(), path
        self.config = stateful_config(spec, list(self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")))
        self.engine = Engine(self.core, path, self.config)
        self.output_names = ["logits"]
        compiled = self.engine.compiled
        self.metrics = anatomy_metrics(graph_counts(compiled.get_runtime_model()))
        get = compiled.get_property
        self.info = {
            "ov_inference_num_threads": get("INFERENCE_NUM_THREADS"),
            "ov_performance_hint": str(get("PERFORMANCE_HINT")).rsplit(".", 1)[-1],
            "ov_num_streams": int(get("NUM_STREAMS")),
            "ov_inference_precision": get("INFERENCE_PRECISION_HINT").to_string(),
            "ov_kv_cache_precision": get("KV_CACHE_PRECISION").to_string(),
            "ov_dynamic_quantization_group_size": get("DYNAMIC_QUANTIZATION_GROUP_SIZE"),
            "ov_decode_state": "set back to the context's depth before each timed call, untimed",
        }

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.prepare(feeds)

    def step(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        return [self.engine.call(np.asarray(inputs["input_ids"]), int(inputs["cache_position"][0]))]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.step(self.prepare(feeds))

    def bind(self, feeds: dict[str, np.ndarray]) -> Bound:
        return self.engine.bind(self.prepare(feeds))

    def timer(self):
        """The host clock around the call alone: a decode call's state is set back before it."""

        def timed(step: Any) -> int:
            if isinstance(step, Bound):
                step.rewind()
            t0 = time.perf_counter_ns()
            step()
            return time.perf_counter_ns() - t0

        return timed

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """Layers by type, from OpenVINO's performance counters (PERF_COUNT) of a second compiled
        model with the same settings and its own state, read after each call."""
        engine = Engine(self.core, self.path, {**self.config, "PERF_COUNT": True})
        bound = engine.bind(engine.prepare(feeds))
        for _ in range(WARMUP):
            bound.rewind()
            bound()
        per_op: dict[str, tuple[int, float]] = {}
        call_us = 0.0
        for _ in range(calls):
            bound.rewind()
            t0 = time.perf_counter_ns()
            bound()
            call_us += (time.perf_counter_ns() - t0) / 1e3
            profile_layers(engine.request.get_profiling_info(), per_op)
        return top_ops({op: v for op, v in per_op.items() if v[1] > 0}, calls, call_us)


class OpenvinoStatefulRuntime(Runtime):
    Options = Options
    LIBRARIES = ("openvino",)
    REQUIRES = ("openvino",)
    PRELOAD = ("openvino",)
    DTYPES = {"cpu": ("float32",)}
    DTYPE_NOTE = "the stateful IR is made from a float32 model (tasks/export/openvino_ir.py)"
    QUANTS = {"cpu": ("none", "int8", "int4", "8da4w")}
    PROFILER = "OpenVINO's performance counters (PERF_COUNT, get_profiling_info), in a compiled model of its own"

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> StatefulSession:
        return StatefulSession(Path(spec.export_dir) / f"{meta['artifact']}.xml", spec)


RUNTIME = OpenvinoStatefulRuntime()
