"""The one place where a phase's feeds meet an ONNX file's inputs, for every runtime of the
format: the file's input and output names and types are read from the file itself (onnx's
API), and a runtime hands the adapter only how it places arrays and reads placed values back.

The phases feed `input_ids`, `cache_position` (decode) and `past_key_values.{i}.key/value`
[B, H_kv, S, D] and read `logits` then `present.*` in kv_names order. A torch export takes
exactly these. onnxruntime-genai's builder (tasks/export/_genai.py) takes `input_ids`,
`attention_mask` [B, cache_position + S] (its GroupQueryAttention reads the positions from it),
maybe `position_ids`, and a past cache that is empty for a prompt; its outputs come keys first.
Its GroupQueryAttention takes either cache: a dynamic one (exactly the context; present grows by
S) or a static buffer with free slots (model.kv_cache=static), which it updates in place when
present.* is bound to the past buffer, as onnxruntime-genai's shared-buffer mode does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tasks.specs import PAST, PRESENT


@dataclass(frozen=True)
class Signature:
    """An ONNX graph's inputs {name: numpy dtype name} and output names, in the file's order."""

    inputs: dict[str, str]
    outputs: list[str]
    in_place: bool = False  # its attention is GroupQueryAttention, which may write present into past


IN_PLACE_OPS = frozenset({"GroupQueryAttention"})  # com.microsoft: past_present_share_buffer


def signature(path: str | Path) -> Signature:
    """The file's own inputs and outputs (its external weights are never read)."""
    # lazy: onnx, only in a job's process
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    types = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name for v in graph.input}
    in_place = any(n.op_type in IN_PLACE_OPS and n.domain == "com.microsoft" for n in graph.node)
    return Signature(types, [v.name for v in graph.output], in_place)


def share_buffers(past: list[str], inputs: dict[str, Any], total: int, device: Placement) -> dict[str, Any]:
    """{present.i: past_key_values.i} when the past buffers hold all `total` positions (a static
    cache): GroupQueryAttention then writes the call's keys and values into them in place. A
    dynamic cache (exactly the context) or an empty one gets a new present from the runtime."""
    if not past or device.shape(inputs[past[0]])[2] < total:
        return {}
    return {n.replace(PAST, PRESENT, 1): inputs[n] for n in past}


class Placement(Protocol):
    """What the adapter needs of a runtime's session: place host arrays on its device, and read
    a placed value's shape and contents back."""

    def place(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]: ...

    def shape(self, value: Any) -> tuple[int, ...]: ...

    def to_host(self, value: Any) -> np.ndarray: ...


class Feeds:
    """The artifact takes the phase's feeds as they are."""

    def __init__(self, sig: Signature, meta: dict[str, Any]):
        ours = meta.get("output_names") or sig.outputs
        # the phase's order (logits, then present.* pairwise), which run_steps feeds back as past
        self.output_names = ours if sorted(ours) == sorted(sig.outputs) else sig.outputs
        self.in_place = sig.in_place  # phasesweep's graph fused into GroupQueryAttention (tasks/export/_ort_attention.py)
        self.past = [n for n in sig.inputs if n.startswith(PAST)]

    def host(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The artifact's inputs from the phase's, on the host."""
        return feeds

    def placed(self, inputs: dict[str, Any], device: Placement) -> dict[str, Any]:
        """The artifact's inputs from the phase's, already placed; `device` places more."""
        return inputs

    def shared(self, inputs: dict[str, Any], device: Placement) -> dict[str, Any]:
        """{output name: the placed input it is written into in place}, for the artifact's placed
        inputs: a static cache's buffers, when GroupQueryAttention updates them."""
        if not self.in_place or "cache_position" not in inputs:
            return {}
        return share_buffers(self.past, inputs, int(device.to_host(inputs["cache_position"])[-1]) + 1, device)


class GenaiFeeds(Feeds):
    """onnxruntime-genai's inputs: attention_mask of ones up to cache_position + S, position_ids
    when the graph takes them, an empty past for a prompt; cache_position itself is implied."""

    def __init__(self, sig: Signature, meta: dict[str, Any]):
        super().__init__(sig, meta)
        self.input_names = list(sig.inputs)
        details = meta["details"]
        self.kv_heads, self.head_dim = details["kv_heads"], details["head_dim"]
        dtype = sig.inputs[self.past[0]] if self.past else "float32"
        self.dtype = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)  # numpy has no bfloat16: its bits

    def _extra(self, batch: int, start: int, seq: int) -> dict[str, np.ndarray]:
        """The mask over every position up to the last new one; new positions start at `start`."""
        out = {"attention_mask": np.ones((batch, start + seq), dtype=np.int64)}
        if "position_ids" in self.input_names:
            out["position_ids"] = np.broadcast_to(np.arange(start, start + seq, dtype=np.int64), (batch, seq)).copy()
        return out

    def _empty(self, batch: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=self.dtype) for n in self.past}

    def host(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = feeds["input_ids"]
        b, s = ids.shape
        past = {n: feeds[n] for n in self.past if n in feeds} or self._empty(b)
        start = int(feeds["cache_position"][0]) if "cache_position" in feeds else 0
        return {"input_ids": ids, **self._extra(b, start, s), **past}

    def placed(self, inputs: dict[str, Any], device: Placement) -> dict[str, Any]:
        b, s = device.shape(inputs["input_ids"])
        past = {n: inputs[n] for n in self.past if n in inputs} or device.place(self._empty(b))
        start = int(device.to_host(inputs["cache_position"])[0]) if "cache_position" in inputs else 0
        return {"input_ids": inputs["input_ids"], **device.place(self._extra(b, start, s)), **past}

    def shared(self, inputs: dict[str, Any], device: Placement) -> dict[str, Any]:
        """A static cache's buffers (they hold every position the mask covers) take the call's
        new keys and values in place, as onnxruntime-genai's shared-buffer mode does."""
        return share_buffers(self.past, inputs, device.shape(inputs["attention_mask"])[1], device)


def feeds_for(sig: Signature, meta: dict[str, Any]) -> Feeds:
    """The adapter of this file's inputs: the builder's when it takes attention_mask and no cache_position."""
    names = set(sig.inputs)
    return GenaiFeeds(sig, meta) if "attention_mask" in names and "cache_position" not in names else Feeds(sig, meta)
