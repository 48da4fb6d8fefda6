"""A captured application on a runtime: the application runs again, unchanged, on the model
phasesweep built, whose forward is answered by the runtime's sessions of the captured prefill
and decode exports; timed as the capture times it (tasks/phases/_capture.py), so its TTFT and
inter-token latency are what a user of that runtime would feel in that loop.

The runtime's cache stays in the runtime's form from step to step (present.i fed back as
past_key_values.i, as decode's parity steps do); the transformers cache the application's loop
holds is kept only as long as the positions filled (one small tensor), which its loop reads."""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np

from tasks.measure.machine import benchmark_cores
from tasks.measure.session import Session
from tasks.model.models import build_model
from tasks.model.tensors import to_numpy
from tasks.phases.captured import load_app, timed_runs, timings
from tasks.runtimes import runtime_module
from tasks.specs import PAST, AppLoopResult, AppLoopSpec, BenchSpec, Failure
from tasks.worker.entries import load_export
from tasks.worker.fresh import in_fresh_process

HOT_CALLS = 50  # back-to-back calls timed after the loop, as a benchmark times them


def _session(spec: BenchSpec) -> tuple[Any, dict[str, np.ndarray]]:
    meta, feeds, _ = load_export(spec.export_dir)
    return runtime_module(spec.runtime).load(spec, meta, feeds), feeds


def _host(value: Any) -> np.ndarray:
    """A runtime's output on the host: a tensor's copy (tasks/model/tensors.py), an OrtValue's."""
    return to_numpy(value) if hasattr(value, "detach") else np.asarray(value.numpy() if hasattr(value, "numpy") else value)


class RuntimeForward:
    """The model's forward, answered by the runtime: a call on an empty cache by the prefill
    session, every later call by the decode session on the cache the call before returned."""

    def __init__(self, spec: AppLoopSpec):
        self.prefill, self.prefill_feeds = _session(spec.prefill)
        self.decode, feeds = _session(spec.decode)
        self.decode_feeds = feeds  # in the graph's input order, which a session may pass its inputs by
        self.past = [n for n in feeds if n.startswith(PAST)]
        self.capacity = {n: feeds[n].shape for n in self.past}  # a static cache's buffers: pad the prompt's to them
        self.static = spec.decode.model.kv_cache == "static"
        self.inputs: dict[str, Any] = {}
        self.spans: list[tuple[int, bool]] = []  # each runtime call's own time (ns), and whether on a filled cache

    def __call__(self, input_ids: Any, cache: Any = None, **_: Any) -> Any:
        import torch  # lazy: torch, only in a job's process
        from transformers.modeling_outputs import CausalLMOutputWithPast  # lazy: torch, only in a job's process

        ids = np.ascontiguousarray(input_ids.numpy())
        start = int(cache.get_seq_length())
        logits = self._prefill(ids) if start == 0 else self._step(ids, start)
        # the application's own cache only counts the positions filled: its loop reads that, never the values
        empty = torch.empty(ids.shape[0], 1, ids.shape[1], 1)
        cache.update(empty, empty, 0)
        return CausalLMOutputWithPast(logits=torch.as_tensor(logits), cache=cache)  # numpy or torch, as the session hands it

    def _prefill(self, ids: np.ndarray) -> np.ndarray:
        first, *placed = self._timed(self.prefill, self.prefill.place({**self.prefill_feeds, "input_ids": ids}), False)
        present = [_host(v) for v in placed]
        arrays = {}
        for name, value in zip(self.past, present, strict=True):
            if self.static:  # the prompt's positions at the front of the decode graph's buffers
                buf = np.zeros(self.capacity[name], dtype=value.dtype)
                buf[:, :, : value.shape[2]] = value
                value = buf
            arrays[name] = value
        self.inputs = self.decode.place({n: arrays.get(n, a) for n, a in self.decode_feeds.items()})
        return self.prefill.to_host(first)

    def _step(self, ids: np.ndarray, start: int) -> np.ndarray:
        if self.static and start >= self.capacity[self.past[0]][2]:
            raise ValueError(
                f"the application reached cache position {start}, the decode export holds {self.capacity[self.past[0]][2]}: "
                "its run on the runtime needs the application's deepest decode call kept (phase.capture.select=spread) "
                "or model.kv_cache=dynamic"
            )
        self.inputs.update(self.decode.place({"input_ids": ids, "cache_position": np.array([start], dtype=np.int64)}))
        first, *present = self._timed(self.decode, self.inputs, True)
        self.inputs.update(zip(self.past, present, strict=True))
        return self.decode.to_host(first)

    def _timed(self, session: Session, inputs: dict[str, Any], filled: bool) -> list[Any]:
        """One step, its call timed as a benchmark times a bound call: the inputs handed over
        (bound) before it, the outputs read after it; those count as the application's own time."""
        staged = session.staged(inputs)
        t0 = time.perf_counter_ns()
        staged.call()
        self.spans.append((time.perf_counter_ns() - t0, filled))
        return staged.outputs()

    def hot(self, calls: int, prompt: np.ndarray) -> dict[str, float]:
        """The medians (ms) of `calls` back-to-back calls, as a benchmark makes them, in this process
        after the loop: the prefill on the prompt, and the decode at the depth the loop ended on."""
        spans: dict[str, list[int]] = {"hot_prefill_forward_ms_median": [], "hot_decode_forward_ms_median": []}
        prefill = self.prefill.staged(self.prefill.place({**self.prefill_feeds, "input_ids": prompt}))
        for key, staged in zip(spans, (prefill, self.decode.staged(self.inputs)), strict=True):
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                staged.call()
                spans[key].append(time.perf_counter_ns() - t0)
        return {k: float(np.median(v)) / 1e6 for k, v in spans.items()}


def call_timings(spans: list[tuple[int, bool]]) -> dict[str, float]:
    """The runtime's own calls inside the timed runs (ms): `app_prefill_call_ms_median`,
    `app_decode_call_ms_mean` and `_median`. The rest of the application's forward (handing
    the runtime its inputs, reading its logits back) is the application's time outside them."""
    prefill = [ns for ns, filled in spans if not filled]
    decode = [ns for ns, filled in spans if filled]
    out = {}
    if prefill:
        out["app_prefill_call_ms_median"] = float(np.median(prefill)) / 1e6
    if decode:
        out["app_decode_call_ms_mean"] = float(np.mean(decode)) / 1e6
        out["app_decode_call_ms_median"] = float(np.median(decode)) / 1e6
    return out


def app_loop_job(spec: AppLoopSpec) -> AppLoopResult:
    """The application once on transformers (its tokens), once on the runtime untimed (warm-up,
    its tokens), then capture.timed_runs times on the runtime, timed."""
    result = AppLoopResult(spec.key, ok=False)
    try:
        import torch  # lazy: torch, only in a job's process

        benchmark_cores(spec.prefill.device, spec.prefill.bench.threads)  # pinned as a benchmark is
        if spec.capture.threads:
            torch.set_num_threads(spec.capture.threads)
        app = load_app(spec.capture)
        model = build_model(spec.capture.model)
        reference = app(model)  # as the capture ran it: the application sets its own grad mode
        # the forward is the runtime's now: torch keeps the loop's small ops, its idle threads would contend with the runtime's
        torch.set_num_threads(1)
        model.forward = forward = RuntimeForward(spec)
        ours = app(model)  # untimed: the sessions' first calls
        forward.spans.clear()
        runs = timed_runs(spec.capture.options.timed_runs, app, model)
        result.timings, _ = timings(runs)
        result.timings.update(call_timings(forward.spans))
        result.timings.update(forward.hot(HOT_CALLS, ours[:, : forward.prefill_feeds["input_ids"].shape[1]].numpy()))
        result.tokens_agree = float((ours == reference).float().mean())
        result.ok = True
    except Exception as e:
        result.failure = Failure("benchmark", f"{type(e).__name__}: {e}", traceback.format_exc())
    return result


def app_loop_in_fresh_process(spec: AppLoopSpec, timeout_s: float | None = None) -> AppLoopResult:
    """The application's imports, threads and both sessions in a process of their own."""
    return in_fresh_process(app_loop_job, spec, timeout_s, "benchmark")
