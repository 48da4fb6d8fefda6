"""The capture run's hooks on the model's forward: every call's signature, and each sequence's
cache followed as it grows (a cache that drops or reorders positions is refused by name);
and the timed runs' clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


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


def cache_of(kwargs: dict[str, Any]) -> Any:
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _layers(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


class Recorder:
    """The capture run's hooks: every call's signature, and each sequence's cache followed."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.sequences: dict[int, _Sequence] = {}  # id(cache object) -> its sequence
        self.order: list[_Sequence] = []
        self._pending: dict[str, Any] | None = None

    def pre(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        import torch  # lazy: torch, only in a job's process

        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = cache_of(kwargs)
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
        import torch  # lazy: torch, only in a job's process

        for i, ((k, v), (ks, vs)) in enumerate(zip(_layers(cache), seq.layers, strict=True)):
            if not (torch.equal(k[:, :, : seq.length], ks) and torch.equal(v[:, :, : seq.length], vs)):
                if getattr(cache.layers[i], "is_sliding", False):  # transformers' sliding-window cache layer
                    raise Refused(
                        f"call {index}: layer {i}'s cache keeps only its sliding window's last positions, and "
                        "phasesweep replays caches holding every position: capture a loop within the window, "
                        "or measure such a model with phase=decode"
                    )
                raise Refused(
                    f"call {index}: the application's cache changed positions it held before (layer {i}); "
                    "phasesweep captures caches that only grow (beam search and cache cropping rewrite them: "
                    "capture a greedy or sampled loop)"
                )

    def post(self, module: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        import torch  # lazy: torch, only in a job's process

        pending, self._pending = self._pending, None
        if pending is None or pending["call"]["kind"] == "unsupported":
            return
        call = pending["call"]
        cache = getattr(output, "cache", None) or getattr(output, "past_key_values", None) or cache_of(kwargs)
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


class Clock:
    """The timed runs' hooks: when each forward started and ended, and whether it had a cache."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int, bool]] = []  # (start ns, end ns, cache filled)
        self._start = 0
        self._filled = False

    def pre(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        cache = cache_of(kwargs)
        self._filled = cache is not None and int(cache.get_seq_length()) > 0
        self._start = time.perf_counter_ns()

    def post(self, module: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        self.spans.append((self._start, time.perf_counter_ns(), self._filled))


def hooked(model: Any, recorder: Any):
    pre = model.register_forward_pre_hook(recorder.pre, with_kwargs=True)
    post = model.register_forward_hook(recorder.post, with_kwargs=True)
    return pre, post
