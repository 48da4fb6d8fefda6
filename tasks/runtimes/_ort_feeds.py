"""The one place where a phase's feeds meet an ONNX file's inputs, chosen by the file's input names.

The phases feed `input_ids`, `cache_position` (decode) and `past_key_values.{i}.key/value`
[B, H_kv, S, D] and read `logits` then `present.*` in kv_names order. A torch export takes
exactly these. onnxruntime-genai's builder (tasks/export/_genai.py) takes `input_ids`,
`attention_mask` [B, past + S] (its GroupQueryAttention reads positions from it), maybe
`position_ids`, and a past cache that is empty for a prompt; its outputs come keys first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.specs import PAST

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


class GenaiFeeds(Feeds):
    """onnxruntime-genai's inputs: attention_mask of ones over past + new positions, position_ids
    when the graph takes them, an empty past for a prompt; cache_position is implied."""

    def __init__(self, session: Any, meta: dict[str, Any]):
        super().__init__(session, meta)
        inputs = {i.name: i for i in session.get_inputs()}
        self.input_names = list(inputs)
        self.past = [n for n in self.input_names if n.startswith(PAST)]
        details = meta["details"]
        self.kv_heads, self.head_dim = details["kv_heads"], details["head_dim"]
        self.dtype = ORT_TYPES[inputs[self.past[0]].type] if self.past else np.float32

    def _extra(self, batch: int, past_len: int, seq: int) -> dict[str, np.ndarray]:
        out = {"attention_mask": np.ones((batch, past_len + seq), dtype=np.int64)}
        if "position_ids" in self.input_names:
            out["position_ids"] = np.broadcast_to(np.arange(past_len, past_len + seq, dtype=np.int64), (batch, seq)).copy()
        return out

    def _empty(self, batch: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=self.dtype) for n in self.past}

    def host(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = feeds["input_ids"]
        b, s = ids.shape
        past = {n: feeds[n] for n in self.past if n in feeds} or self._empty(b)
        return {"input_ids": ids, **self._extra(b, next(iter(past.values())).shape[2], s), **past}

    def placed(self, inputs: dict[str, Any], place: Callable[[dict[str, np.ndarray]], dict[str, Any]]) -> dict[str, Any]:
        b, s = inputs["input_ids"].shape()
        past = {n: inputs[n] for n in self.past if n in inputs} or place(self._empty(b))
        past_len = next(iter(past.values())).shape()[2]
        return {"input_ids": inputs["input_ids"], **place(self._extra(b, past_len, s)), **past}


def feeds_for(session: Any, meta: dict[str, Any]) -> Feeds:
    """The adapter of this file's inputs: the builder's when it takes attention_mask and no cache_position."""
    names = {i.name for i in session.get_inputs()}
    return GenaiFeeds(session, meta) if "attention_mask" in names and "cache_position" not in names else Feeds(session, meta)
