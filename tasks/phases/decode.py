"""Decode: one new token per sequence against a KV cache already holding the context.

Timed directly on the pre-filled cache, never derived from prefill by subtraction.

  input_ids [B, 1], cache_position [1], past_key_values.{i}.key/value [B, H_kv, S, D]
    -> logits [B, 1, V], present.{i}.key/value (static: [B, H_kv, S, D], dynamic: S + 1)

A static cache holds `cache_len` slots (default: the context plus HEADROOM), whatever
`parity_steps` is, so a parity setting never changes the timed shape.

An in-graph cache (model.kv_cache=update_cache, `cache_len` slots) is no input: the graph
takes input_ids [B, 1], cache_position [1] and returns logits only. Its feeds carry the
context tokens (CONTEXT), which the session runs through the program to fill the program's
own cache before the first call; a step repeated at the same position is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.measure.anatomy import bytes_read_per_step
from tasks.measure.parity import compare, summary
from tasks.model.tensors import dtype_name, to_numpy
from tasks.phases._common import PhaseData, check_span, synthetic_only, tokens
from tasks.phases._quality import reference_logprobs
from tasks.specs import (
    CONTEXT,
    DTYPE_BYTES,
    IN_GRAPH_KV_CACHES,
    PAST,
    PRESENT,
    ConfigError,
    PhaseSpec,
    at_least,
    kv_names,
)

if TYPE_CHECKING:
    import torch

# a backend that fixes the depth (tasks/contract.py fixed_depth) measures phase.depths as one variant per
# depth: they differ by context_len alone, and are named by it (_ctx512)
NAMING_KEYS = ("phase.context_len",)
HEADROOM = 8  # default static-cache slots past the context: room for this many new tokens


def capacity(phase: PhaseSpec) -> int:
    """Slots of a static cache: cache_len, or the deepest context plus HEADROOM."""
    return phase.cache_len or deepest(phase) + HEADROOM


def deepest(phase: PhaseSpec) -> int:
    """The most positions any measured call finds cached: context_len, or the deepest of phase.depths."""
    return max(phase.depths or (phase.context_len,))


def series(phase: PhaseSpec) -> tuple[int, ...]:
    """The depths measured from the one export besides the headline call's context_len: phase.depths.
    The export stores each one's data (at_depth), the benchmark times each after the headline."""
    return tuple(d for d in phase.depths or () if d != phase.context_len)


def at_depth(phase: PhaseSpec, depth: int) -> PhaseSpec:
    """The phase as a call at `depth` sees it: that context, the same capacity, seed and steps, so the
    data at a depth is what a variant with context_len=depth makes (bar a static cache's capacity)."""
    return replace(phase, context_len=depth)


def normalize(phase: PhaseSpec, kv_cache: str) -> PhaseSpec:
    """Decode uses batch, context, cache and steps; a dynamic cache has no fixed capacity.
    phase.depths becomes the sorted distinct depths, context_len among them."""
    depths = phase.depths
    if depths is not None:
        bad = [d for d in depths if not isinstance(d, int) or isinstance(d, bool) or d < 1]
        if bad or not depths:
            raise ConfigError(
                f"phase.depths={list(depths)!r} is not allowed; choose a list of positive cache depths, "
                "e.g. [128,512,1024] (or null: context_len only)"
            )
        depths = tuple(sorted({*depths, *([phase.context_len] if phase.context_len else [])}))
    phase = replace(phase, depths=depths)
    fixed = kv_cache == "static" or kv_cache in IN_GRAPH_KV_CACHES
    cache_len = capacity(phase) if fixed and phase.context_len else None
    return replace(phase, prompt_len=None, cache_len=cache_len, capture=None)


def check(phase: PhaseSpec, dims: dict[str, int] | None = None) -> None:
    synthetic_only(phase)
    at_least("phase.batch", phase.batch, 1)
    at_least("phase.context_len", phase.context_len, 1)
    at_least("phase.parity_steps", phase.parity_steps, 1)
    at_least("phase.cache_len", phase.cache_len, 1, optional=True)
    need = deepest(phase) + phase.parity_steps
    if phase.cache_len is not None and phase.cache_len < need:
        deep = "the deepest of phase.depths" if phase.depths else "context_len"
        default = "" if phase.cache_len != deepest(phase) + HEADROOM else f" (the default: {deep} + 8)"
        held = f"phase.depths' deepest={deepest(phase)}" if phase.depths else f"context_len={phase.context_len}"
        raise ConfigError(
            f"phase.cache_len={phase.cache_len}{default} cannot hold {held} "
            f"+ parity_steps={phase.parity_steps} = {need} positions; raise phase.cache_len or lower phase.parity_steps"
        )
    if dims:
        check_span("phase.context_len + phase.parity_steps" if not phase.depths else "phase.depths + phase.parity_steps", need, dims)
        if phase.cache_len is not None:
            check_span("phase.cache_len", phase.cache_len, dims)


def tokens_per_call(phase: PhaseSpec) -> int:
    return 1


def io_names(phase: PhaseSpec, layers: int, kv_cache: str = "static") -> tuple[list[str], list[str]]:
    if kv_cache in IN_GRAPH_KV_CACHES:
        return ["input_ids", "cache_position"], ["logits"]
    return ["input_ids", "cache_position", *kv_names(PAST, layers)], ["logits", *kv_names(PRESENT, layers)]


def make_data(model: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int]) -> PhaseData:
    """The headline call's data (at context_len), and with phase.depths each other depth's (series)."""
    data = _data_at(model, phase, kv_cache, dims)
    data.series = {d: _data_at(model, at_depth(phase, d), kv_cache, dims) for d in series(phase)}
    return data


def _data_at(model: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int]) -> PhaseData:
    """The cache after a seeded context of context_len tokens, filled by the reference
    transformers model and laid out [B, H_kv, S, D]; the first step's token; and the
    reference logits of parity_steps consecutive steps decoding seeded tokens."""
    import torch  # lazy: torch, only in a job's process

    gen = torch.Generator().manual_seed(phase.seed)
    b = phase.batch
    ctx = tokens(gen, dims["vocab"], (b, phase.context_len))  # [B, C]
    steps = tokens(gen, dims["vocab"], (b, phase.parity_steps))  # [B, N]
    from transformers import DynamicCache  # lazy: torch, only in a job's process

    with torch.inference_mode():
        # a DynamicCache without the config keeps every position of every layer (with it, sliding
        # layers keep only their window); the model still masks sliding layers by their window
        cache = model(input_ids=ctx, use_cache=True, cache=DynamicCache()).cache  # C positions
    data = data_from_cache(model, phase, kv_cache, dims, cache, steps)
    if kv_cache in IN_GRAPH_KV_CACHES:  # the program's own cache is filled with the context
        data.feeds[CONTEXT] = ctx.numpy()
    return data


def data_from_cache(
    model: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int], cache: Any, steps: torch.Tensor
) -> PhaseData:
    """A decode call's data from a transformers cache holding context_len positions and the
    tokens of parity_steps steps [B, N]: the cache laid out by `kv_cache` ([B, H_kv, S, D]),
    the first step's token, and the reference logits of every step, each decoded by the
    reference model on the cache the step before left."""
    import torch  # lazy: torch, only in a job's process

    with torch.inference_mode():
        past, dtypes = _laid_out(phase, kv_cache, dims, cache)
        feeds = {
            "input_ids": np.ascontiguousarray(steps[:, :1].numpy()),  # [B, 1]
            "cache_position": np.array([phase.context_len], dtype=np.int64),  # [1]
            **past,
        }
        refs = []
        for t in range(phase.parity_steps):  # the reference decodes the same tokens, step by step
            out = model(input_ids=steps[:, t : t + 1], cache=cache, use_cache=True)
            refs.append(out.logits[:, -1:].float())  # [B, 1, V]
    assert list(feeds) == io_names(phase, dims["layers"], kv_cache)[0]
    return PhaseData(feeds, {"step_tokens": steps.numpy(), "ref_logits": torch.stack(refs).numpy()}, dims, dtypes)


def _laid_out(phase: PhaseSpec, kv_cache: str, dims: dict[str, int], cache: Any) -> tuple[dict, dict[str, str]]:
    """A transformers cache as the graph's past inputs ({} for an in-graph cache), and their dtypes."""
    from tasks.model.kv_cache import make_kv_cache  # lazy: torch, only in a job's process

    layout = make_kv_cache(kv_cache)
    past: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    names = iter(kv_names(PAST, dims["layers"]))
    slots = capacity(phase)  # a dynamic cache ignores it: it holds exactly the context
    for layer in cache.layers if kv_cache not in IN_GRAPH_KV_CACHES else ():
        for t in (layer.keys, layer.values):
            name = next(names)
            past[name] = to_numpy(layout.from_prefix(t.clone(), slots))
            dtypes[name] = dtype_name(t)
    return past, dtypes


QUALITY_PREFIX = 2  # tokens a quality window's cache holds before the artifact steps (a growing cache: no size-1 dim)


def quality_inputs(
    model: torch.nn.Module, ref: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int], take: Any, tokens: int
) -> tuple[dict[str, np.ndarray] | None, str]:
    """Teacher-forced windows of the text, each as long as the cache holds: its first
    QUALITY_PREFIX tokens are cached by `model` (as parity's context is), the artifact then
    steps through the next S positions, each step predicting the token after it. Windows
    [W, B, PREFIX + S + 1]; the reference's log-probabilities in the artifact's order
    (window, step, row)."""
    import torch  # lazy: torch, only in a job's process
    from transformers import DynamicCache  # lazy: torch, only in a job's process


    b, pre = phase.batch, QUALITY_PREFIX
    count = -(-tokens // (b * (capacity(phase) - pre)))  # windows of at most capacity - PREFIX steps
    steps = -(-tokens // (b * count))
    span = pre + steps + 1
    ids = take(count * b * span)
    count = min(count, len(ids) // (b * span))
    if count < 1:
        return None, f"the quality text has {len(ids)} tokens; decode needs {b * span} for one window"
    windows = ids[: count * b * span].reshape(count, b, span)
    arrays: dict[str, np.ndarray] = {"q_tokens": windows.numpy()}
    with torch.inference_mode():
        for w, win in enumerate(windows):
            cache = model(input_ids=win[:, :pre], use_cache=True, cache=DynamicCache()).cache
            arrays.update({f"q{w}.{n}": a for n, a in _laid_out(phase, kv_cache, dims, cache)[0].items()})
    logprobs = reference_logprobs(ref, windows.reshape(count * b, span), steps + 1)[:, :steps]  # positions PREFIX..
    logprobs = logprobs.reshape(count, b, steps, -1).transpose(0, 2, 1, 3)
    arrays["q_ref_logprobs"] = np.ascontiguousarray(logprobs.reshape(count * steps * b, -1))
    arrays["q_targets"] = windows[:, :, pre + 1 :].numpy().transpose(0, 2, 1).reshape(-1)
    return arrays, ""


def quality_logits(session: Any, phase: PhaseSpec, feeds: dict, q: dict[str, np.ndarray]) -> np.ndarray:
    """The artifact's logits [N, V] over the stored windows, stepped as parity steps (run_steps)."""
    pre = QUALITY_PREFIX
    past = [n for n in feeds if n.startswith(PAST)]
    out = []
    for w, win in enumerate(q["q_tokens"]):  # [B, PREFIX + S + 1]
        window = {"input_ids": win[:, pre : pre + 1], "cache_position": np.array([pre], dtype=np.int64)}
        window.update({n: q[f"q{w}.{n}"] for n in past})
        if CONTEXT in feeds:  # an in-graph cache: the program caches the prefix itself
            window[CONTEXT] = np.ascontiguousarray(win[:, :pre])
        logits = session.run_steps(window, win[:, pre:-1], pre)  # S steps of [B, 1, V]
        out.append(np.stack(logits)[:, :, 0])  # [S, B, V]
    return np.concatenate([o.reshape(-1, o.shape[-1]) for o in out])


def build_graph(model: torch.nn.Module, phase: PhaseSpec, family: str, kv_cache: str, attention: str) -> torch.nn.Module:
    from tasks.model.graphs import (  # lazy: torch, only in a job's process
        DecodeGraph,
        InGraphCacheGraph,
        swap_attention,
    )

    swap_attention(model, family, kv_cache, attention)
    in_graph = kv_cache in IN_GRAPH_KV_CACHES
    graph = InGraphCacheGraph(model, phase.batch, capacity(phase)) if in_graph else DecodeGraph(model)
    graph.kv_cache = kv_cache  # exporters read it: a dynamic cache has a dynamic sequence dim
    return graph.eval()


def check_parity(session: Any, phase: PhaseSpec, feeds: dict, parity: dict, atol: float) -> dict[str, Any]:
    """parity_steps consecutive steps, each fed the cache the backend returned (an in-graph
    cache: the program's own, filled with the context first), every step compared: a graph
    that drops its cache passes the first step only."""

    ref = parity["ref_logits"]  # [N, B, 1, V]
    logits = session.run_steps(feeds, parity["step_tokens"], int(feeds["cache_position"][0]))
    return summary([compare(step, ref[t], atol) for t, step in enumerate(logits)], atol)


def extra_metrics(
    *,
    model_dtype: str,
    details: dict[str, Any],
    feeds: dict[str, np.ndarray],
    median_ms: float,
    peak_gbs: float | None,
    phase: PhaseSpec | None = None,
    anatomy: dict[str, Any] | None = None,
    bandwidth: Callable[[], dict[str, float]] | None = None,
) -> dict[str, float]:
    """Bytes one decode step moves, per second of median latency (and its fraction of the
    device's peak, if known). Counted as the graph is exported:
    - weights: with an artifact, its constants as stored (tasks/measure/anatomy.py: packed
      int4 and its scales at their bytes), each read once, except the tables read by row
      (an embedding, a rotary cache), of which a step reads its B rows; without one (eager,
      compile), every parameter at the model dtype, an untied input embedding's B rows only
      (a tied table is read whole by the output head anyway);
    - KV cache: attention reads every slot of the cache it is given (a static cache's
      unfilled slots are masked, not skipped), and the functional update (index_copy /
      cat, out of place so that one graph serves ONNX and ExecuTorch) reads and writes the
      whole cache again: 3x the cache's bytes. A runtime that elides that copy moves less.
      An in-graph cache (llama::custom_sdpa) reads only the context_len + 1 filled slots of
      each layer's keys and values, and update_cache writes the one new slot in place.

    `bandwidth_share`: that achieved bandwidth as a share of the roofline: the device's peak on a
    GPU (peak_gbs), else the machine's own read bandwidth (`bandwidth()`, tasks/measure/bandwidth.py).
    """
    element = DTYPE_BYTES[model_dtype]
    batch = feeds["input_ids"].shape[0]
    if anatomy is not None:
        weights = bytes_read_per_step(anatomy, batch)
    else:
        params = details["parameters"]
        if not details.get("tied_embeddings", 1):
            params -= details["embedding_parameters"] - batch * details["hidden_size"]
        weights = params * element
    cache = 3 * sum(a.nbytes for n, a in feeds.items() if n.startswith(PAST))
    if CONTEXT in feeds:  # the cache is in the program: per layer, keys and values of C + 1 slots
        slots = feeds[CONTEXT].shape[1] + 1
        cache = 2 * details["layers"] * batch * slots * details["kv_heads"] * details["head_dim"] * element
    achieved = (weights + cache) / (median_ms / 1e3) / 1e9
    out = {
        "decode_bytes_per_step": float(weights + cache),
        "decode_weight_bytes_per_step": float(weights),
        "decode_cache_bytes_per_step": float(cache),
        "achieved_bandwidth_gbs": achieved,
    }
    if peak_gbs:
        out.update(peak_bandwidth_gbs=peak_gbs, bandwidth_fraction_of_peak=achieved / peak_gbs, bandwidth_share=achieved / peak_gbs)
    elif bandwidth is not None:
        machine = bandwidth()
        out.update(
            machine_read_bandwidth_gbs=machine["read_gbs"],
            machine_copy_bandwidth_gbs=machine["copy_gbs"],
            bandwidth_share=achieved / machine["read_gbs"],
        )
    return out
