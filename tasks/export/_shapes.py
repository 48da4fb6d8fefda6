"""Which graph inputs have a dynamic dimension: a growing (dynamic) KV cache's sequence, and
an in-graph cache's token count (one graph fills a context and decodes)."""

from __future__ import annotations

import torch

from tasks.specs import IN_GRAPH_KV_CACHES, PAST


def dynamic_shapes(graph: torch.nn.Module, args: tuple[torch.Tensor, ...], input_names: list[str]):
    """None (all static) unless the decode graph takes a growing cache: then the sequence
    dim of every past_key_values input is dynamic, up to the model's max positions."""
    if getattr(graph, "kv_cache", "static") in IN_GRAPH_KV_CACHES and graph.capacity > 1:
        seq = torch.export.Dim("seq", min=1, max=graph.capacity)  # input_ids [B, S], cache_position [S]
        return ({1: seq}, {0: seq})
    past = [i for i, n in enumerate(input_names) if n.startswith(PAST)]
    if not past or getattr(graph, "kv_cache", "static") != "dynamic":
        return None
    max_len = graph.lm.config.max_position_embeddings
    # Dim.DYNAMIC rather than a named Dim: the symbolic solver cannot prove some guards
    # that grouped-query attention produces (min(16 + 16*s, 32 + 32*s) == 16 + 16*s) for a named
    # Dim; the bounds still give ExecuTorch's memory planner its upper limit
    seq = torch.export.Dim.DYNAMIC(min=1, max=max_len - 1)
    static = [None] * (len(args) - len(past))
    return (*static, tuple({2: seq} for _ in past))


def example_args(graph: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The arguments to export with: an in-graph cache's graph is traced on two tokens at
    positions 0 and 1, since torch.export specializes a dimension it sees at size 1."""
    if getattr(graph, "kv_cache", "static") not in IN_GRAPH_KV_CACHES or graph.capacity < 2:
        return args
    ids = args[0]
    return ids[:, :1].repeat(1, 2), torch.arange(2, dtype=torch.int64)
