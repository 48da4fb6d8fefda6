"""Capture the phases of a real application: run it on the model phasesweep built, record
every forward call the model sees, keep a few of them as variants (phase=captured).

`capture_job(spec)` is a pure function of a plain spec, like the export and benchmark jobs:
an application that raises, never calls the model, or calls it in a way no phasesweep graph
represents gives a result whose failure says so; it does not raise.

1. The capture run. The application (`package.module:function`, called with the model) runs
   once with hooks on the model's forward. Each call's signature is recorded: its kind
   (prefill: no cache or an empty one; decode: one new token on a filled cache), batch, new
   tokens, how full the cache is, and its token ids. Each sequence's cache is followed: the
   positions it holds are copied as they are appended and checked unchanged at every later
   call. A cache that drops or reorders positions (beam search, cropping) cannot become
   phasesweep's append-only cache, and the capture refuses it by name.
2. Selection (`select`, pure): the distinct signatures of each kind, ordered by length
   (prompt or context) then batch; `capture.max_variants` of each, chosen by `capture.select`:
   spread (the shortest, the longest and evenly spaced lengths in between), first (in call
   order) or longest.
3. Each kept call's inputs are written once, in a file named by the digest of its content:
   a prefill's prompt [B, P]; a decode's cache before the call (its sequence's first
   context_len positions, [B, H_kv, C, D] per layer, as transformers holds it) with the
   tokens of the call and of the calls after it in the same sequence (parity's steps).
4. The timed runs. The application runs `capture.timed_runs` times more with only a clock
   on each forward: time to first token, inter-token latencies, and the share of the loop
   spent outside the model's forward (sampling, cache management, Python). The capture
   run's hooks copy caches, so it is never timed.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.specs import CaptureResult, CaptureSpec, ConfigError, Failure, PhaseSpec

KINDS = ("prefill", "decode")
SELECT = ("spread", "first", "longest")
APP_FORMAT = "package.module:function"


# -- the torch-free half: the driver checks and selects with these ------------------------------


def parse_app(app: str) -> tuple[str, str]:
    """(module, function) of `package.module:function`, or a ConfigError naming the format."""
    module, sep, function = (app or "").partition(":")
    ok = sep and module and function and all(p.isidentifier() for p in (*module.split("."), *function.split(".")))
    if not ok:
        raise ConfigError(f"phase.app={app!r} must name a function as {APP_FORMAT} (e.g. examples.generate_app:run)")
    return module, function


def signature_key(call: dict[str, Any]) -> tuple[Any, ...]:
    """Two calls with equal keys do the same work: same kind, batch, new tokens and fill."""
    return (call["kind"], call["batch"], call["new_tokens"], call["context"])


def length(call: dict[str, Any]) -> int:
    """What orders a kind's calls: a prefill's prompt, a decode's context."""
    return call["new_tokens"] if call["kind"] == "prefill" else call["context"]


def select(distinct: list[dict[str, Any]], n: int, rule: str) -> list[dict[str, Any]]:
    """`n` of one kind's distinct calls (each the first call of its signature, in call order).

    spread: the shortest, the longest and evenly spaced in between (by length); first: the
    first n in call order; longest: the n longest. Kept calls come back in call order."""
    if rule not in SELECT:
        raise ConfigError(f"phase.capture.select={rule!r} is not allowed; choose one of: {', '.join(SELECT)}")
    if len(distinct) <= n:
        return list(distinct)
    if rule == "first":
        kept = distinct[:n]
    else:
        ordered = sorted(distinct, key=lambda c: (length(c), c["batch"], c["call"]))
        if rule == "longest":
            kept = ordered[-n:]
        elif n == 1:
            kept = ordered[:1]
        else:
            picks = sorted({round(i * (len(ordered) - 1) / (n - 1)) for i in range(n)})
            kept = [ordered[i] for i in picks]
    return sorted(kept, key=lambda c: c["call"])


def distinct_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each distinct signature once: its first call, with how many calls shared it."""
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in calls:
        key = signature_key(c)
        if key in first:
            first[key]["count"] += 1
        else:
            first[key] = {**c, "count": 1}
    return list(first.values())


def describe(result: CaptureResult) -> str:
    """One line: calls seen, distinct signatures by kind, which became variants."""
    kinds: dict[str, int] = {}
    for c in result.calls:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    by_kind = ", ".join(f"{n} {k}" for k, n in kinds.items())
    kept = ", ".join(
        f"{p.kind} " + (f"p{p.prompt_len}" if p.kind == "prefill" else f"ctx{p.context_len}") + (f" b{p.batch}" if p.batch != 1 else "")
        for p in result.kept
    )
    return f"{result.total_calls} model calls, {len(result.calls)} distinct signatures ({by_kind}); kept: {kept}"


# -- the job (torch) ----------------------------------------------------------------------------


class Refused(Exception):
    """The application ran the model in a way the capture cannot follow (raised from a hook)."""


@dataclass
class _Sequence:
    """One cache's positions as the capture saw them appended: per layer (keys, values)."""

    index: int  # its place among the sequences the capture run saw
    layers: list[list[Any]] = field(default_factory=list)  # [[keys, values], ...] [B, H_kv, S, D]
    length: int = 0
    tokens: list[Any] = field(default_factory=list)  # input ids of each call on it, in order
    calls: list[int] = field(default_factory=list)  # the calls' indices


def _cache_of(kwargs: dict[str, Any]) -> Any:
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _layers(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


class _Recorder:
    """The capture run's hooks: every call's signature, and each sequence's cache followed."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.sequences: dict[int, _Sequence] = {}  # id(cache object) -> its sequence
        self.order: list[_Sequence] = []
        self._pending: dict[str, Any] | None = None

    def pre(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = _cache_of(kwargs)
        past = int(cache.get_seq_length()) if cache is not None else 0
        call: dict[str, Any] = {"call": len(self.calls), "context": past}
        why = None
        if ids is None:
            call.update(kind="unsupported", batch=0, new_tokens=0)
            why = "inputs_embeds instead of input_ids"
        else:
            batch, new = int(ids.shape[0]), int(ids.shape[1])
            call.update(batch=batch, new_tokens=new, kind="prefill" if past == 0 else "decode")
            mask = kwargs.get("attention_mask")
            positions = kwargs.get("position_ids")
            if past and new != 1:
                why = f"{new} new tokens on a filled cache (chunked prefill or speculative decoding)"
            elif isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()):
                why = "a padded batch (attention_mask has zeros): phasesweep's graphs take no mask"
            elif isinstance(positions, torch.Tensor):
                want = torch.arange(past, past + new, device=positions.device).expand(batch, new)
                if positions.shape[-1] != new or not torch.equal(positions.reshape(-1, new).expand(batch, new), want):
                    why = "position ids that do not continue the cache (left padding?)"
        seq = self.sequences.get(id(cache)) if cache is not None and past else None
        if past and why is None:
            if seq is None:
                why = "a cache the capture did not see filled (made outside the model's forward)"
            elif seq.length != past:
                why = f"a cache holding {past} positions where the capture followed {seq.length}"
            else:
                self._check_unchanged(call["call"], seq, cache)
        if why:
            call["kind"], call["why"] = "unsupported", why
        self._pending = {"call": call, "ids": None if ids is None else ids.detach().clone(), "seq": seq}
        self.calls.append(call)

    def _check_unchanged(self, index: int, seq: _Sequence, cache: Any) -> None:
        import torch

        for i, ((k, v), (ks, vs)) in enumerate(zip(_layers(cache), seq.layers, strict=True)):
            if not (torch.equal(k[:, :, : seq.length], ks) and torch.equal(v[:, :, : seq.length], vs)):
                raise Refused(
                    f"call {index}: the application's cache changed positions it held before (layer {i}); "
                    "phasesweep captures caches that only grow (beam search and cache cropping rewrite them: "
                    "capture a greedy or sampled loop)"
                )

    def post(self, module: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        import torch

        pending, self._pending = self._pending, None
        if pending is None or pending["call"]["kind"] == "unsupported":
            return
        call = pending["call"]
        cache = getattr(output, "cache", None) or getattr(output, "past_key_values", None) or _cache_of(kwargs)
        if cache is None:  # use_cache=False: nothing to follow; a prefill is still a prefill
            return
        seq = pending["seq"]
        if seq is None:  # a prefill starts a sequence
            empty = [[k[:, :, :0].clone(), v[:, :, :0].clone()] for k, v in _layers(cache)]
            seq = _Sequence(len(self.order), empty)
            self.order.append(seq)
        self.sequences[id(cache)] = seq
        new = int(cache.get_seq_length())
        for pair, (k, v) in zip(seq.layers, _layers(cache), strict=True):
            pair[0] = torch.cat([pair[0], k[:, :, seq.length : new].detach().clone()], dim=2)
            pair[1] = torch.cat([pair[1], v[:, :, seq.length : new].detach().clone()], dim=2)
        seq.length = new
        seq.tokens.append(pending["ids"])
        seq.calls.append(call["call"])
        call["sequence"] = seq.index


class _Clock:
    """The timed runs' hooks: when each forward started and ended, and whether it had a cache."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int, bool]] = []  # (start ns, end ns, cache filled)
        self._start = 0
        self._filled = False

    def pre(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        cache = _cache_of(kwargs)
        self._filled = cache is not None and int(cache.get_seq_length()) > 0
        self._start = time.perf_counter_ns()

    def post(self, module: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        self.spans.append((self._start, time.perf_counter_ns(), self._filled))


def _hooked(model: Any, recorder: Any):
    pre = model.register_forward_pre_hook(recorder.pre, with_kwargs=True)
    post = model.register_forward_hook(recorder.post, with_kwargs=True)
    return pre, post


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
    mine = [f for f in frames if "site-packages" not in f.filename and "/tasks/phases/_capture.py" not in f.filename]
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


def _inputs(recorder: _Recorder, call: dict[str, Any], steps: int) -> dict[str, np.ndarray]:
    """The arrays a kept call is replayed from: a decode call's `steps` tokens are its own and
    those the application fed next (fewer near the loop's end: tasks/phases/captured.py
    continues them with the reference's greedy picks)."""
    from tasks.model.tensors import dtype_name, to_numpy

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


def read_inputs(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {name: z[name] for name in z.files}


def _timings(runs: list[tuple[int, int, list[tuple[int, int, bool]]]]) -> tuple[dict[str, float], list[int]]:
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
        out["app_decode_tokens_per_s"] = 1e3 / p50
    if prefill:
        out["app_prefill_forward_ms_median"] = float(np.median(prefill)) / 1e6
    if decode:
        out["app_decode_forward_ms_median"] = float(np.median(decode)) / 1e6
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


def capture_job(spec: CaptureSpec) -> CaptureResult:
    """Run the application once recording, select the calls to keep, write their inputs,
    then time it `capture.timed_runs` times."""
    result = CaptureResult(key=spec.key, ok=False)
    try:
        import torch

        from tasks.model.models import build_model

        app = load_app(spec)
        if spec.threads:
            torch.set_num_threads(spec.threads)
        model = build_model(spec.model)
        recorder = _Recorder()
        hooks = _hooked(model, recorder)
        try:
            app(model)
        except Refused as e:
            result.failure = Failure("capture", f"phase.app={spec.app!r}: {e}")
            return result
        except Exception as e:
            result.failure = Failure("capture", _app_error(spec, e), traceback.format_exc())
            return result
        finally:
            for h in hooks:
                h.remove()
        result.total_calls = len(recorder.calls)
        if not recorder.calls:
            result.failure = Failure(
                "capture",
                f"phase.app={spec.app!r} returned without calling the model it was given (0 forward calls); "
                "it must run that model (e.g. model.generate(...))",
            )
            return result
        result.calls = distinct_calls(recorder.calls)
        result.notes = sorted({f"{c['why']} ({sum(1 for d in recorder.calls if d.get('why') == c['why'])} call(s))" for c in recorder.calls if c.get("why")})
        kept: list[PhaseSpec] = []
        for kind in KINDS:
            for call in select([c for c in result.calls if c["kind"] == kind], spec.options.max_variants, spec.options.select):
                arrays = _inputs(recorder, call, spec.parity_steps)
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
                        inputs=_write(Path(spec.store), arrays),
                    )
                )
        if not kept:
            result.failure = Failure(
                "capture",
                f"phase.app={spec.app!r} made {result.total_calls} model call(s), none a prefill or decode phasesweep "
                f"can represent: {'; '.join(result.notes)}",
            )
            return result
        result.kept = kept
        del recorder
        runs = []
        for _ in range(spec.options.timed_runs):
            clock = _Clock()
            hooks = _hooked(model, clock)
            try:
                t0 = time.perf_counter_ns()
                app(model)
                runs.append((t0, time.perf_counter_ns(), clock.spans))
            finally:
                for h in hooks:
                    h.remove()
        if runs and all(r[2] for r in runs):
            result.timings, result.inter_token_ns = _timings(runs)
            result.at_calls = _near([p.call for p in kept], runs)
        result.ok = True
    except ConfigError as e:
        result.failure = Failure("capture", str(e))
    except Exception as e:
        result.failure = Failure("capture", f"{type(e).__name__}: {e}", traceback.format_exc())
    return result


def capture_in_fresh_process(spec: CaptureSpec, timeout_s: float | None = None) -> CaptureResult:
    """capture_job in a process of its own: the application's imports and threads stay there."""
    from tasks.jobs import in_fresh_process

    return in_fresh_process(capture_job, spec, timeout_s, "capture")


def summary(result: CaptureResult) -> dict[str, Any]:
    """The capture's record as JSON: calls seen, distinct signatures, kept, the app's timings."""
    return {
        "total_calls": result.total_calls,
        "distinct_signatures": result.calls,
        "kept": [asdict(p) for p in result.kept],
        "not_representable": result.notes,
        "timings": result.timings,
        "loop_at_kept_calls": result.at_calls,
    }
