"""Prefill: the whole prompt against an empty KV cache.

  input_ids [B, P] -> logits [B, 1, V] (last position), present.{i}.key/value [B, H_kv, P, D]
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tasks.phases._common import PhaseData, check_span, tokens
from tasks.specs import PRESENT, PhaseSpec, at_least, kv_names

if TYPE_CHECKING:
    import torch


def normalize(phase: PhaseSpec, kv_cache: str) -> PhaseSpec:
    """Prefill uses batch and prompt_len; the cache and step fields are decode's."""
    return replace(phase, context_len=None, cache_len=None, parity_steps=1)


def check(phase: PhaseSpec, dims: dict[str, int] | None = None) -> None:
    at_least("phase.batch", phase.batch, 1)
    at_least("phase.prompt_len", phase.prompt_len, 1)
    if dims:
        check_span("phase.prompt_len", phase.prompt_len, dims)


def tokens_per_call(phase: PhaseSpec) -> int:
    return phase.prompt_len


def io_names(layers: int) -> tuple[list[str], list[str]]:
    return ["input_ids"], ["logits", *kv_names(PRESENT, layers)]


def make_data(model: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int]) -> PhaseData:
    """A seeded prompt and the transformers model's own last-position logits."""
    import torch

    gen = torch.Generator().manual_seed(phase.seed)
    ids = tokens(gen, dims["vocab"], (phase.batch, phase.prompt_len))  # [B, P]
    with torch.inference_mode():
        ref = model(input_ids=ids, use_cache=False).logits[:, -1:]  # [B, 1, V]
    return PhaseData({"input_ids": ids.numpy()}, {"ref_logits": ref[None].float().numpy()}, dims)


def build_graph(model: torch.nn.Module, family: str, kv_cache: str, attention: str) -> torch.nn.Module:
    from tasks.graphs import PrefillGraph, swap_attention

    swap_attention(model, family, kv_cache, attention)
    graph = PrefillGraph(model)
    graph.kv_cache = kv_cache  # exporters read it: a dynamic cache has a dynamic sequence dim
    return graph.eval()


def check_parity(session: Any, feeds: dict, parity: dict, atol: float) -> dict[str, Any]:
    """One call against the reference logits."""
    from tasks.parity import compare, summary

    return summary([compare(session.run(feeds)[0], parity["ref_logits"][0])], atol)


def extra_metrics(**_: Any) -> dict[str, float]:
    return {}
