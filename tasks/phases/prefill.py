"""Prefill: the whole prompt against an empty KV cache.

  input_ids [B, P] -> logits [B, 1, V] (last position), present.{i}.key/value [B, H_kv, P, D]

An in-graph cache (model.kv_cache=update_cache, P slots) is no output: the graph takes
input_ids [B, P], cache_position [P] (0..P-1) and returns logits only; repeating the call
rewrites the same slots.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.measure.parity import compare, rel_error, summary
from tasks.model.tensors import as_float32
from tasks.phases._common import PhaseData, check_span, synthetic_only, tokens
from tasks.phases._quality import reference_logprobs
from tasks.specs import IN_GRAPH_KV_CACHES, PRESENT, PhaseSpec, at_least, kv_names

if TYPE_CHECKING:
    import torch

NAMING_KEYS: tuple[str, ...] = ()  # a prefill variant is named by what the user swept alone


def normalize(phase: PhaseSpec, kv_cache: str) -> PhaseSpec:
    """Prefill uses batch and prompt_len; the cache and step fields are decode's."""
    return replace(phase, context_len=None, cache_len=None, depths=None, parity_steps=1, capture=None)


def check(phase: PhaseSpec, dims: dict[str, int] | None = None) -> None:
    synthetic_only(phase)
    at_least("phase.batch", phase.batch, 1)
    at_least("phase.prompt_len", phase.prompt_len, 1)
    if dims:
        check_span("phase.prompt_len", phase.prompt_len, dims)


def series(phase: PhaseSpec) -> tuple[int, ...]:
    """Prefill measures its one prompt: no series."""
    return ()


def tokens_per_call(phase: PhaseSpec) -> int:
    return phase.prompt_len


def io_names(phase: PhaseSpec, layers: int, kv_cache: str = "static") -> tuple[list[str], list[str]]:
    if kv_cache in IN_GRAPH_KV_CACHES:
        return ["input_ids", "cache_position"], ["logits"]
    return ["input_ids"], ["logits", *kv_names(PRESENT, layers)]


def make_data(model: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int]) -> PhaseData:
    """A seeded prompt, and the transformers model's own last-position logits and the
    cache it fills ([B, H_kv, P, D] per layer, as float32)."""
    import torch  # lazy: torch, only in a job's process

    gen = torch.Generator().manual_seed(phase.seed)
    data = data_from_prompt(model, tokens(gen, dims["vocab"], (phase.batch, phase.prompt_len)), dims)
    if kv_cache in IN_GRAPH_KV_CACHES:
        data.feeds["cache_position"] = np.arange(phase.prompt_len, dtype=np.int64)  # [P]
    return data


def data_from_prompt(model: torch.nn.Module, ids: torch.Tensor, dims: dict[str, int]) -> PhaseData:
    """A prefill call's data from its prompt [B, P]: the reference's last-position logits and
    the cache it fills."""
    import torch  # lazy: torch, only in a job's process
    from transformers import DynamicCache  # lazy: torch, only in a job's process

    with torch.inference_mode():  # without the config, sliding layers' caches keep every position too
        out = model(input_ids=ids, use_cache=True, cache=DynamicCache())
    ref = {"ref_logits": out.logits[:, -1:][None].float().numpy()}  # [1, B, 1, V]
    names = iter(kv_names(PRESENT, dims["layers"]))
    for layer in out.cache.layers:
        ref["ref_" + next(names)] = layer.keys.float().numpy()
        ref["ref_" + next(names)] = layer.values.float().numpy()
    return PhaseData({"input_ids": ids.numpy()}, ref, dims)


def build_graph(model: torch.nn.Module, phase: PhaseSpec, family: str, kv_cache: str, attention: str) -> torch.nn.Module:
    from tasks.model.graphs import (  # lazy: torch, only in a job's process
        InGraphCacheGraph,
        PrefillGraph,
        swap_attention,
    )

    swap_attention(model, family, kv_cache, attention)
    in_graph = kv_cache in IN_GRAPH_KV_CACHES
    graph = InGraphCacheGraph(model, phase.batch, phase.prompt_len) if in_graph else PrefillGraph(model)
    graph.kv_cache = kv_cache  # exporters read it: a dynamic cache has a dynamic sequence dim
    return graph.eval()


def check_parity(session: Any, phase: PhaseSpec, feeds: dict, parity: dict, atol: float) -> dict[str, Any]:
    """One call: its logits against the reference's, and every returned present.* cache
    against the cache the reference filled (a graph that returns a wrong cache would
    otherwise pass prefill and hand decode garbage). An in-graph cache returns none: decode's
    parity, stepping through the program's own filled cache, checks it."""

    logits, *present = session.run(feeds)
    report = summary([compare(logits, parity["ref_logits"][0], atol)], atol)
    names = [n for n in session.output_names if n.startswith(PRESENT)]
    pairs = [(as_float32(a), parity["ref_" + n]) for n, a in zip(names, present, strict=True)]
    if pairs:
        report["cache_max_abs_diff"] = max(float(np.max(np.abs(a - e))) for a, e in pairs)
        report["cache_max_rel_error"] = max(rel_error(a, e, logits=False) for a, e in pairs)
        report["passed"] = report["passed"] and report["cache_max_abs_diff"] <= atol
    return report


def quality_inputs(
    model: torch.nn.Module, ref: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int], take: Any, tokens: int
) -> tuple[dict[str, np.ndarray] | None, str]:
    """Windows of prompt_len tokens sliding by one, B to a call: each call's last position
    predicts the token after its window. Windows [calls, B, P + 1] (the last column: the target)."""
    b, p = phase.batch, phase.prompt_len
    calls = -(-tokens // b)
    ids = take(calls * b + p)
    calls = min(calls, (len(ids) - p) // b)
    if calls < 1:
        return None, f"the quality text has {len(ids)} tokens; prefill needs {p + b} for one call"

    starts = np.arange(calls * b)[:, None] + np.arange(p + 1)
    windows = ids[starts].reshape(calls, b, p + 1)
    logprobs = reference_logprobs(ref, windows.reshape(calls * b, p + 1)[:, :p], 1)[:, 0]
    return {"q_tokens": windows.numpy(), "q_ref_logprobs": logprobs, "q_targets": windows[..., p].reshape(-1).numpy()}, ""


def quality_logits(session: Any, phase: PhaseSpec, feeds: dict, q: dict[str, np.ndarray]) -> np.ndarray:
    """The artifact's last-position logits [N, V], one call per window of B rows."""
    out = []
    for call in q["q_tokens"]:  # [B, P + 1]
        logits, *_ = session.run({**feeds, "input_ids": np.ascontiguousarray(call[:, :-1])})
        out.append(logits[:, -1])
    return np.concatenate(out)


def extra_metrics(**_: Any) -> dict[str, float]:
    return {}
