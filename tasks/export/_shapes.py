"""Which graph inputs have a dynamic dimension: only a growing (dynamic) KV cache does."""

from __future__ import annotations

import torch

from tasks.specs import PAST


def dynamic_shapes(graph: torch.nn.Module, args: tuple[torch.Tensor, ...], input_names: list[str]):
    """None (all static) unless the decode graph takes a growing cache: then the sequence
    dim of every past_key_values input is dynamic, up to the model's max positions."""
    past = [i for i, n in enumerate(input_names) if n.startswith(PAST)]
    if not past or getattr(graph, "kv_cache", "static") != "dynamic":
        return None
    max_len = graph.lm.config.max_position_embeddings
    # Dim.DYNAMIC rather than a named Dim: the symbolic solver cannot prove some guards
    # that GQA's repeat_kv produces (min(16 + 16*s, 32 + 32*s) == 16 + 16*s) for a named
    # Dim; the bounds still give ExecuTorch's memory planner its upper limit
    seq = torch.export.Dim.DYNAMIC(min=1, max=max_len - 1)
    static = [None] * (len(args) - len(past))
    return (*static, tuple({2: seq} for _ in past))
