"""Every phase's inputs, generated from the model config, and eager reference outputs.

The user never writes a tensor: token ids are drawn from a seeded generator over the
model's vocabulary, and a decode step's filled KV cache comes from running the reference
transformers model over a generated context. Reference logits always come from the
unmodified transformers model (its own attention and DynamicCache), so parity checks the
swapped KV cache and attention modules as well as the exporter and the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tasks.graphs import io_names
from tasks.kv_cache import make_kv_cache
from tasks.models import model_dims
from tasks.specs import PhaseSpec


@dataclass
class PhaseData:
    feeds: dict[str, np.ndarray]  # the timed call's inputs, by graph input name, in call order
    parity: dict[str, np.ndarray]  # step_tokens [B, N] (decode), ref_logits [N, B, 1, V]
    dims: dict[str, int]

    def example_args(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(a) for a in self.feeds.values())

    def shapes(self) -> dict[str, list[int]]:
        return {name: list(a.shape) for name, a in self.feeds.items()}


def check_phase(phase: PhaseSpec, dims: dict[str, int]) -> None:
    """Shapes must fit the model; the error names the key, the value and the limit."""
    limit = dims["max_positions"]
    window = dims.get("sliding_window", 0)
    span = phase.prompt_len if phase.name == "prefill" else phase.context_len + phase.parity_steps
    if window and span > window:
        # phasesweep's attention modules attend over the whole cache: past the window the
        # model (and its eager reference) would attend differently
        raise ValueError(
            f"the model attends within a sliding_window={window}, and phase needs {span} positions "
            f"(phase.{'prompt_len' if phase.name == 'prefill' else 'context_len + parity_steps'}); "
            f"phasesweep's attention is full attention: keep it <= {window}"
        )
    if phase.name == "prefill":
        if not 1 <= phase.prompt_len <= limit:
            raise ValueError(
                f"phase.prompt_len={phase.prompt_len} must be in [1, {limit}] (model max_position_embeddings)"
            )
        return
    need = phase.context_len + phase.parity_steps
    cache_len = phase.capacity()
    if cache_len < need:
        raise ValueError(
            f"phase.cache_len={phase.cache_len} cannot hold context_len={phase.context_len} "
            f"+ parity_steps={phase.parity_steps} = {need} positions"
        )
    if cache_len > limit:
        raise ValueError(
            f"phase.context_len={phase.context_len} (+ parity_steps, cache_len={cache_len}) exceeds "
            f"the model's max_position_embeddings={limit}"
        )


def _tokens(gen: torch.Generator, vocab: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=gen, dtype=torch.int64)


@torch.inference_mode()
def make_phase_data(model: torch.nn.Module, phase: PhaseSpec, kv_cache: str) -> PhaseData:
    """Inputs of `phase` for `model` (unswapped) and its reference logits."""
    dims = model_dims(model)
    check_phase(phase, dims)
    gen = torch.Generator().manual_seed(phase.seed)
    b = phase.batch
    if phase.name == "prefill":
        ids = _tokens(gen, dims["vocab"], (b, phase.prompt_len))  # [B, P]
        ref = model(input_ids=ids, use_cache=False).logits[:, -1:]  # [B, 1, V]
        feeds = {"input_ids": ids.numpy()}
        return PhaseData(feeds, {"ref_logits": ref[None].float().numpy()}, dims)

    ctx = _tokens(gen, dims["vocab"], (b, phase.context_len))  # [B, C]
    steps = _tokens(gen, dims["vocab"], (b, phase.parity_steps))  # [B, N]
    cache = model(input_ids=ctx, use_cache=True).cache  # reference DynamicCache holding C positions
    cache_module = make_kv_cache(kv_cache)
    cache_len = phase.capacity()
    past: dict[str, np.ndarray] = {}
    for i, layer in enumerate(cache.layers):
        past[f"past_key_values.{i}.key"] = cache_module.from_prefix(layer.keys.clone(), cache_len).numpy()
        past[f"past_key_values.{i}.value"] = cache_module.from_prefix(layer.values.clone(), cache_len).numpy()
    feeds = {
        "input_ids": np.ascontiguousarray(steps[:, :1].numpy()),  # [B, 1]
        "cache_position": np.array([phase.context_len], dtype=np.int64),  # [1]
        **past,
    }
    refs = []
    for t in range(phase.parity_steps):  # the reference decodes the same tokens, step by step
        out = model(input_ids=steps[:, t : t + 1], cache=cache, use_cache=True)
        refs.append(out.logits[:, -1:].float())  # [B, 1, V]
    assert list(feeds) == io_names("decode", dims["layers"])[0]
    return PhaseData(feeds, {"step_tokens": steps.numpy(), "ref_logits": torch.stack(refs).numpy()}, dims)
