"""OpenVINO on the CPU running the stateful IR optimum-intel makes (tasks/export/openvino_ir.py):
its KV cache is OpenVINO state inside the compiled model, which one InferRequest keeps between
calls. Imports no torch.

A call feeds input_ids [B, n], attention_mask [B, start + n] (ones), position_ids [B, n]
(start..start+n-1) and beam_idx [B] (0..B-1: each row keeps its own cache), and the state must
hold exactly the `start` positions before it:
  prefill  the prompt's P tokens at 0..P-1: reset_state() then one infer, both in the timed call
           (a new sequence starts with an empty state)
  decode   one token after the context's C tokens were run into the state (the phase's CONTEXT
           feed, one prefill); each call appends its position to the state, as a generation's
           steps do, so the calls run at depths C, C+1, ..., C+REFILL-1; then the state is emptied
           and the context run into it again, untimed (the session's timer() runs `rewind` before
           starting the clock). The state is never written from outside between timed calls
The output head runs on the last position only (last_position_logits, as openvino_genai's
LLMPipeline slices the IR when it loads it): logits [B, 1, V], as phasesweep's graphs return.
Parity steps through the IR's own state (run_steps): consecutive calls, nothing set back.
A call at a position below the state's depth (a new window of the quality inputs) trims the
state to it, as openvino_genai does between generations.

How it is set, each recorded as a param: tasks/runtimes/openvino.py's config() (threads, the
LATENCY hint with one stream, the inference precision, dynamic quantisation of activations for
8da4w, CPU pinning from backend.options.cpu_pinning), and KV_CACHE_PRECISION from
backend.options.kv_cache_precision (auto: f32 for a float32 model; the CPU plugin's own default
here, OpenVINO 2026.4.1 on this project's CPU, is f16, which rounds every cached key and value).
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
from tasks.runtimes.openvino import Options as PluginOptions
from tasks.runtimes.openvino import anatomy_metrics, config, graph_counts, plugin_params, profile_layers
from tasks.specs import CONTEXT, BenchSpec, choice

KV_PRECISIONS = ("auto", "f32", "f16", "u8")
SEQ_AXIS = 2  # the state's layout: [B, H_kv, seq, D]
# decode calls per run from the context's depth (depths C..C+REFILL-1), then the state is refilled:
# setting it back to depth C before every call (set_state) made the calls 1.16x to 1.18x slower
# than free-running steps and LLMPipeline's (125M model, 1 thread, load 2 to 3); 16 more positions
# move a call's time by well under 1% (C=128 -> 512 moved it 6%)
REFILL = 16
HEAD_DEPTH = 4  # ops between the logits and the output head's MatMul, at most


@dataclass(frozen=True)
class Options(PluginOptions):
    kv_cache_precision: str = "auto"  # auto: f32 for a float32 model | f32 | f16 (the plugin's default here) | u8

    def __post_init__(self) -> None:
        choice("backend.options.kv_cache_precision", self.kv_cache_precision, KV_PRECISIONS)


def stateful_config(spec: BenchSpec, capabilities: list[str]) -> dict[str, Any]:
    options = Options(**spec.runtime_options)
    precision = options.kv_cache_precision
    if precision == "auto":
        precision = "f32" if spec.model.dtype == "float32" else "f16"
    return {**config(spec, capabilities, options.cpu_pinning), "KV_CACHE_PRECISION": precision}


class Bound:
    """One call on the request. `rewind()`, untimed before each call (StatefulSession.timer), sets
    the call's inputs on the request (a parity step in between set others). A decode call
    appends its token to the state, so call k of a run of REFILL runs at depth start + k; after
    REFILL calls, or when another call moved the state, rewind() empties the state and runs the
    context into it again (a prefill)."""

    def __init__(self, engine: Engine, ids: np.ndarray, start: int, context: np.ndarray | None):
        import openvino as ov  # lazy: openvino, only in a job's process

        self.engine, self.start, self.k = engine, start, 0
        steps = REFILL if start else 1
        feeds = [engine.feeds(ids, start + k) for k in range(steps)]
        self.tensors = [{n: ov.Tensor(np.ascontiguousarray(a)) for n, a in f.items()} for f in feeds]
        self.context = None if context is None else engine.feeds(np.asarray(context), 0)

    def rewind(self) -> None:
        request = self.engine.request
        if self.start and (self.k == len(self.tensors) or self.engine.depth != self.start + self.k):
            # a decode's run is over, or another call (a parity step) moved the state: the context again
            request.reset_state()
            request.infer(self.context, share_inputs=True)  # not into the tensors set before (ours)
            self.k, self.engine.depth = 0, self.start
        for name, tensor in self.tensors[self.k].items():
            request.set_tensor(name, tensor)

    def __call__(self) -> None:
        request = self.engine.request
        if self.start == 0:
            request.reset_state()
            request.infer()
            return
        request.start_async()  # on the compiled model's stream thread, as LLMPipeline runs a decode step
        request.wait()
        self.k += 1
        self.engine.depth = self.start + self.k


def last_position_logits(model: Any) -> Any:
    """`model` with its output head applied to the last position only: a Slice of the hidden
    states before the head's MatMul, as openvino_genai's LLMPipeline does when it loads the IR
    (optimum-intel's IR returns every position's logits; phasesweep's graphs return the last's,
    [B, 1, V]). Walks from the logits up through the head's elementwise ops (a cast, a soft-cap)."""
    import openvino.opset13 as ops  # lazy: openvino, only in a job's process

    result = next(r for r in model.get_results() if "logits" in r.output(0).get_names() or "logits" in r.input_value(0).get_names())
    node = result.input_value(0).get_node()
    for _ in range(HEAD_DEPTH):
        if node is None or node.get_type_name() == "MatMul":
            break
        node = next((v.get_node() for v in node.input_values() if v.get_node().get_type_name() != "Constant"), None)
    if node is None or node.get_type_name() != "MatMul":
        raise RuntimeError(f"no MatMul within {HEAD_DEPTH} ops above the IR's logits: its output head was not found")
    hidden = node.input_value(0)  # [B, S, H]
    if hidden.get_partial_shape().rank.get_length() != 3:
        raise RuntimeError(f"the output head's input is {hidden.get_partial_shape()}, not [B, S, H]")
    last = ops.slice(hidden, np.array([-1]), np.array([np.iinfo(np.int64).max]), np.array([1]), np.array([1]))
    node.input(0).replace_source_output(last.output(0))
    model.validate_nodes_and_infer_types()
    return model


class Engine:
    """A compiled stateful model, its one request, and the depth its state holds."""

    def __init__(self, core: Any, path: Path, settings: dict[str, Any]):
        self.compiled = core.compile_model(last_position_logits(core.read_model(str(path))), "CPU", settings)
        self.request = self.compiled.create_infer_request()
        self.depth = 0

    @staticmethod
    def feeds(ids: np.ndarray, start: int) -> dict[str, np.ndarray]:
        rows, n = ids.shape
        return {
            "input_ids": np.ascontiguousarray(ids, dtype=np.int64),
            "attention_mask": np.ones((rows, start + n), dtype=np.int64),
            "position_ids": np.ascontiguousarray(np.broadcast_to(np.arange(start, start + n, dtype=np.int64), (rows, n))),
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
        # shared: the request takes these arrays as its inputs; without it infer() copies them into
        # the tensors set before, a bound call's own, which would then feed this call's tokens
        self.request.infer(self.feeds(ids, start), share_inputs=True)
        self.depth = start + ids.shape[1]
        return self.request.get_tensor("logits").data.astype(np.float32)  # a copy

    def bind(self, feeds: dict[str, np.ndarray]) -> Bound:
        """The call of `feeds` (the phase's): a decode's context run into the state first."""
        context = feeds.get(CONTEXT)
        inputs = self.prepare(feeds)
        ids, start = np.asarray(inputs["input_ids"]), int(inputs["cache_position"][0])
        self.seek(start)
        return Bound(self, ids, start, context)

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
        self.info = {
            **plugin_params(compiled),
            "ov_kv_cache_precision": compiled.get_property("KV_CACHE_PRECISION").to_string(),
            "ov_decode_depths": f"context_len to context_len+{REFILL - 1}: the state refilled by a prefill every {REFILL} calls, untimed",
            "ov_logits": "last position (a Slice before the output head, as openvino_genai slices at load)",
        }

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.prepare(feeds)

    def step(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        return [self.engine.call(np.asarray(inputs["input_ids"]), int(inputs["cache_position"][0]))]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.step(self.prepare(feeds))

    def bind(self, feeds: dict[str, np.ndarray]) -> Bound:
        return self.engine.bind(feeds)

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
        bound = engine.bind(feeds)
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
