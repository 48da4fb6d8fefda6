"""Capture the phases of a real application (phase=captured): run it once on the model
phasesweep built with hooks recording every forward call (tasks/phases/_recorder.py), keep a
few distinct calls as variants (tasks/phases/_calls.py), write each kept call's inputs once
(a file named by its content's digest), then time the application `capture.timed_runs`
times with only a clock on the forward (the recording run copies caches: never timed).

capture_job never raises for the application's failure: its result's failure says what it did.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from tasks.model.models import build_model
from tasks.model.tensors import dtype_name, to_numpy
from tasks.phases._calls import KINDS, distinct_calls, parse_app, select
from tasks.phases._recorder import Clock, Recorder, Refused, hooked
from tasks.specs import CaptureResult, CaptureSpec, ConfigError, Failure, PhaseSpec
from tasks.worker.fresh import in_fresh_process


def load_app(spec: CaptureSpec):
    module, function = parse_app(spec.app)
    if spec.app_path and spec.app_path not in sys.path:
        sys.path.insert(0, spec.app_path)
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ConfigError(f"phase.app={spec.app!r}: cannot import {module} ({e}); searched {spec.app_path or 'sys.path'}") from None
    for part in function.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"phase.app={spec.app!r}: {module} has no {function}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"phase.app={spec.app!r}: {function} is not callable")
    return obj


def _app_error(spec: CaptureSpec, exc: BaseException) -> str:
    """What the application raised, and where in its own code (the last frame outside torch
    and transformers, so the user sees their line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "site-packages" not in f.filename and "/tasks/phases/_" not in f.filename]
    where = f" (at {mine[-1].filename}:{mine[-1].lineno} in {mine[-1].name})" if mine else ""
    return f"phase.app={spec.app!r} raised {type(exc).__name__}: {exc}{where}"


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _write(store: Path, arrays: dict[str, np.ndarray]) -> str:
    """The arrays in `store`/<digest>.npz (written once; an equal file is kept): its path."""
    store.mkdir(parents=True, exist_ok=True)
    path = store / f"{_digest(arrays)[:32]}.npz"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    return str(path)


def _inputs(recorder: Recorder, call: dict[str, Any], steps: int) -> dict[str, np.ndarray]:
    """The arrays a kept call is replayed from: a decode call's `steps` tokens are its own and
    those the application fed next (fewer near the loop's end: tasks/phases/captured.py
    continues them with the reference's greedy picks)."""
    seq = recorder.order[call["sequence"]]
    at = seq.calls.index(call["call"])
    if call["kind"] == "prefill":
        return {"input_ids": seq.tokens[at].numpy()}
    # this call's token and those of the decode calls right after it on the same sequence
    run = [seq.tokens[at]]
    for j in range(at + 1, len(seq.calls)):
        if len(run) >= steps or seq.tokens[j].shape[1] != 1:
            break
        run.append(seq.tokens[j])
    arrays = {"input_ids": seq.tokens[at].numpy(), "step_tokens": np.concatenate([t.numpy() for t in run], axis=1)}
    c = call["context"]
    for i, (k, v) in enumerate(seq.layers):
        arrays[f"past.{i}.key"] = to_numpy(k[:, :, :c])
        arrays[f"past.{i}.value"] = to_numpy(v[:, :, :c])
    arrays["cache_dtype"] = np.array(dtype_name(seq.layers[0][0]))
    return arrays


def timings(runs: list[tuple[int, int, list[tuple[int, int, bool]]]]) -> tuple[dict[str, float], list[int]]:
    """The application's own figures from the timed runs: (app start, app end, forward spans)."""
    ttft, walls, outside, prefill, decode, gaps = [], [], [], [], [], []
    for start, end, spans in runs:
        wall = end - start
        walls.append(wall)
        outside.append(1 - sum(b - a for a, b, _ in spans) / wall if wall else 0.0)
        # the first token is out when the loop hands it back: the next call starts
        ttft.append((spans[1][0] if len(spans) > 1 else end) - start)
        prefill += [b - a for a, b, filled in spans if not filled]
        decode += [b - a for a, b, filled in spans if filled]
        gaps += [b[0] - a[0] for a, b in zip(spans, spans[1:], strict=False) if a[2] and b[2]]
    out = {
        "app_runs": float(len(runs)),
        "app_calls": float(len(runs[0][2])),
        "app_seconds": float(np.median(walls)) / 1e9,
        "app_ttft_ms": float(np.median(ttft)) / 1e6,
        "app_outside_forward_share": float(np.median(outside)),
    }
    if gaps:
        p10, p50, p90 = (float(q) for q in np.percentile(gaps, [10, 50, 90]) / 1e6)
        out.update(app_inter_token_ms_median=p50, app_inter_token_ms_p10=p10, app_inter_token_ms_p90=p90)
        out["app_inter_token_ms_mean"] = float(np.mean(gaps)) / 1e6  # what a generation's TPOT averages
        out["app_decode_tokens_per_s"] = 1e3 / p50
    if prefill:
        out["app_prefill_forward_ms_median"] = float(np.median(prefill)) / 1e6
    if decode:
        out["app_decode_forward_ms_median"] = float(np.median(decode)) / 1e6
        out["app_decode_forward_ms_mean"] = float(np.mean(decode)) / 1e6
    return out, [int(g) for g in gaps]


NEAR = 4  # a kept call's figures in the loop: the calls of its kind this close (positions), every timed run


def _near(calls: list[int], runs: list[tuple[int, int, list[tuple[int, int, bool]]]]) -> dict[int, dict[str, float]]:
    """For each kept call, the application's own loop at that point (ms, medians over every
    timed run): `app_forward_ms`, its eager forward (a prefill call's own; a decode call's and
    those of the decode calls within NEAR of it), and for a decode call `app_inter_token_ms`,
    the time from one decode call's start to the next's there. Empty when the timed runs did
    not make the calls the capture run made (an application that varies)."""
    spans = [r[2] for r in runs]
    if len({len(s) for s in spans}) != 1 or max(calls) >= len(spans[0]):
        return {}
    n = len(spans[0])
    out: dict[int, dict[str, float]] = {}
    for k in calls:
        filled = spans[0][k][2]
        near = range(max(0, k - NEAR), min(n, k + NEAR + 1)) if filled else (k,)
        took = [s[i][1] - s[i][0] for s in spans for i in near if s[i][2] == filled]
        out[k] = {"app_forward_ms": float(np.median(took)) / 1e6}
        gaps = [s[i + 1][0] - s[i][0] for s in spans for i in near if i + 1 < n and s[i][2] and s[i + 1][2]]
        if filled and gaps:
            out[k]["app_inter_token_ms"] = float(np.median(gaps)) / 1e6
    return out


class _Ended(Exception):
    """The capture ends here, failed with this message (and the trace of what raised, if any)."""

    def __init__(self, error: str, trace: str = ""):
        super().__init__(error)
        self.trace = trace


def capture_job(spec: CaptureSpec) -> CaptureResult:
    """Run the application once recording, select the calls to keep, write their inputs,
    then time it `capture.timed_runs` times."""
    result = CaptureResult(key=spec.key, ok=False)
    try:
        import torch  # lazy: torch, only in a job's process

        app = load_app(spec)
        if spec.threads:
            torch.set_num_threads(spec.threads)
        model = build_model(spec.model)
        recorder = _record(spec, app, model)
        result.total_calls = len(recorder.calls)
        if not recorder.calls:
            raise _Ended(
                f"phase.app={spec.app!r} returned without calling the model it was given (0 forward calls); "
                "it must run that model (e.g. model.generate(...))"
            )
        result.calls = distinct_calls(recorder.calls)
        result.notes = sorted({f"{c['why']} ({sum(1 for d in recorder.calls if d.get('why') == c['why'])} call(s))" for c in recorder.calls if c.get("why")})
        result.kept = _keep(spec, recorder, result.calls)
        if not result.kept:
            raise _Ended(
                f"phase.app={spec.app!r} made {result.total_calls} model call(s), none a prefill or decode phasesweep "
                f"can represent: {'; '.join(result.notes)}"
            )
        del recorder
        runs = timed_runs(spec.options.timed_runs, app, model)
        if runs and all(r[2] for r in runs):
            result.timings, result.inter_token_ns = timings(runs)
            result.at_calls = _near([p.call for p in result.kept], runs)
        result.ok = True
    except _Ended as e:
        result.failure = Failure("capture", str(e), e.trace)
    except ConfigError as e:
        result.failure = Failure("capture", str(e))
    except Exception as e:
        result.failure = Failure("capture", f"{type(e).__name__}: {e}", traceback.format_exc())
    return result


def _record(spec: CaptureSpec, app: Any, model: Any) -> Recorder:
    """The application run once with every forward call of the model recorded."""
    recorder = Recorder()
    hooks = hooked(model, recorder)
    try:
        app(model)
    except Refused as e:
        raise _Ended(f"phase.app={spec.app!r}: {e}") from None
    except Exception as e:
        raise _Ended(_app_error(spec, e), traceback.format_exc()) from None
    finally:
        for h in hooks:
            h.remove()
    return recorder


def _keep(spec: CaptureSpec, recorder: Recorder, calls: list[dict[str, Any]]) -> list[PhaseSpec]:
    """The selected calls of each kind as captured phases, their inputs written to the store."""
    kept = []
    for kind in KINDS:
        for call in select([c for c in calls if c["kind"] == kind], spec.options.max_variants, spec.options.select):
            kept.append(
                PhaseSpec(
                    name="captured",
                    batch=call["batch"],
                    prompt_len=call["new_tokens"] if kind == "prefill" else None,
                    context_len=call["context"] if kind == "decode" else None,
                    parity_steps=spec.parity_steps if kind == "decode" else 1,
                    app=spec.app,
                    kind=kind,
                    call=call["call"],
                    inputs=_write(Path(spec.store), _inputs(recorder, call, spec.parity_steps)),
                )
            )
    return kept


def timed_runs(n: int, app: Any, model: Any) -> list[tuple[int, int, list]]:
    """(start ns, end ns, the model calls' spans) of `n` runs of the application."""
    runs = []
    for _ in range(n):
        clock = Clock()
        hooks = hooked(model, clock)
        try:
            t0 = time.perf_counter_ns()
            app(model)
            runs.append((t0, time.perf_counter_ns(), clock.spans))
        finally:
            for h in hooks:
                h.remove()
    return runs


def capture_in_fresh_process(spec: CaptureSpec, timeout_s: float | None = None) -> CaptureResult:
    """The application's imports and threads stay in a process of its own."""
    return in_fresh_process(capture_job, spec, timeout_s, "capture")
