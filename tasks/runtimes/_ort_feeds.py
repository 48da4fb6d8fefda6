"""The one place where a phase's feeds meet an ONNX file's inputs, chosen by the file's input names.

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

from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.specs import PAST, PRESENT

ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": np.uint16}


class Feeds:
    """The artifact takes the phase's feeds as they are."""

    def __init__(self, session: Any, meta: dict[str, Any]):
        names = [o.name for o in session.get_outputs()]
        ours = meta.get("output_names") or names
        # the phase's order (logits, then present.* pairwise), which run_steps feeds back as past
        self.output_names = ours if sorted(ours) == sorted(names) else names

    def host(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The artifact's inputs from the phase's, on the host."""
        return feeds

    def placed(self, inputs: dict[str, Any], place: Callable[[dict[str, np.ndarray]], dict[str, Any]]) -> dict[str, Any]:
        """The artifact's inputs from the phase's, already placed (OrtValues); `place` places more."""
        return inputs

    def shared(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """{output name: the placed input it is written into in place}, for the artifact's placed inputs."""
        return {}


class GenaiFeeds(Feeds):
    """onnxruntime-genai's inputs: attention_mask of ones up to cache_position + S, position_ids
    when the graph takes them, an empty past for a prompt; cache_position itself is implied."""

    def __init__(self, session: Any, meta: dict[str, Any]):
        super().__init__(session, meta)
        inputs = {i.name: i for i in session.get_inputs()}
        self.input_names = list(inputs)
        self.past = [n for n in self.input_names if n.startswith(PAST)]
        details = meta["details"]
        self.kv_heads, self.head_dim = details["kv_heads"], details["head_dim"]
        self.dtype = ORT_TYPES[inputs[self.past[0]].type] if self.past else np.float32

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

    def placed(self, inputs: dict[str, Any], place: Callable[[dict[str, np.ndarray]], dict[str, Any]]) -> dict[str, Any]:
        b, s = inputs["input_ids"].shape()
        past = {n: inputs[n] for n in self.past if n in inputs} or place(self._empty(b))
        start = int(inputs["cache_position"].numpy()[0]) if "cache_position" in inputs else 0
        return {"input_ids": inputs["input_ids"], **place(self._extra(b, start, s)), **past}

    def shared(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """A past buffer that holds every position the mask covers (a static cache) takes the
        call's new keys and values in place: present.i is bound to past_key_values.i. A dynamic
        cache (exactly the context) or an empty one gets a new present from ONNX Runtime."""
        if not self.past:
            return {}
        total = inputs["attention_mask"].shape()[1]
        if inputs[self.past[0]].shape()[2] < total:
            return {}
        return {n.replace(PAST, PRESENT, 1): inputs[n] for n in self.past}


def feeds_for(session: Any, meta: dict[str, Any]) -> Feeds:
    """The adapter of this file's inputs: the builder's when it takes attention_mask and no cache_position."""
    names = {i.name for i in session.get_inputs()}
    return GenaiFeeds(session, meta) if "attention_mask" in names and "cache_position" not in names else Feeds(session, meta)
