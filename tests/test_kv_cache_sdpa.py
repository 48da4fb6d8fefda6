"""The KV cache and attention modules on their own: shapes, updates, and equality with
the transformers reference implementation."""

from __future__ import annotations

import pytest
import torch

from tasks.model import kv_cache, sdpa
from tasks.specs import ATTENTIONS, IN_GRAPH_KV_CACHES, KV_CACHES, LLAMA_OPS

B, H, HKV, D = 2, 4, 2, 16
# the modules on [B, H, S, D] tensors with a mask; the in-graph pair is tests/test_in_graph_cache.py's
MASKED = tuple(a for a in ATTENTIONS if a != LLAMA_OPS["model.attention"])
FUNCTIONAL = tuple(c for c in KV_CACHES if c not in IN_GRAPH_KV_CACHES)


def test_registries_match_the_choices_the_driver_validates():
    assert tuple(kv_cache.KV_CACHES) == KV_CACHES
    assert tuple(sdpa.ATTENTIONS) == ATTENTIONS


def test_static_update_writes_at_positions_and_keeps_the_rest():
    cache = torch.randn(B, HKV, 10, D)
    new = torch.randn(B, HKV, 2, D)
    k, v = kv_cache.StaticKVCache().update(cache, cache, new, new, torch.tensor([4, 5]))
    assert k.shape == (B, HKV, 10, D)
    torch.testing.assert_close(k[:, :, 4:6], new)
    torch.testing.assert_close(k[:, :, :4], cache[:, :, :4])
    torch.testing.assert_close(k[:, :, 6:], cache[:, :, 6:])
    assert not torch.equal(cache[:, :, 4:6], new)  # functional: the input is untouched


def test_dynamic_update_appends():
    cache, new = torch.randn(B, HKV, 7, D), torch.randn(B, HKV, 1, D)
    k, _ = kv_cache.DynamicKVCache().update(cache, cache, new, new, torch.tensor([7]))
    assert k.shape == (B, HKV, 8, D)
    torch.testing.assert_close(k[:, :, 7:], new)


def test_static_from_prefix_pads_to_capacity():
    prefix = torch.randn(B, HKV, 5, D)
    buf = kv_cache.StaticKVCache.from_prefix(prefix, 9)
    assert buf.shape == (B, HKV, 9, D)
    torch.testing.assert_close(buf[:, :, :5], prefix)
    assert not buf[:, :, 5:].any()
    with pytest.raises(ValueError, match="does not fit"):
        kv_cache.StaticKVCache.from_prefix(prefix, 4)


def test_unknown_names_are_refused_with_choices():
    with pytest.raises(ValueError, match="model.kv_cache='paged' is unknown; choose one of static, dynamic"):
        kv_cache.make_kv_cache("paged")
    with pytest.raises(ValueError, match="model.attention='flash' is unknown; choose one of sdpa, math"):
        sdpa.make_attention("flash")


def _qkv(sq: int, skv: int):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(B, H, sq, D, generator=g),
        torch.randn(B, HKV, skv, D, generator=g),
        torch.randn(B, HKV, skv, D, generator=g),
    )


@pytest.mark.parametrize("name", MASKED)
@pytest.mark.parametrize("sq,skv,pos", [(6, 6, list(range(6))), (1, 12, [7])])
def test_attention_matches_transformers_eager(name, sq, skv, pos):
    """Same output as transformers' eager_attention_forward with the equivalent additive mask."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q, k, v = _qkv(sq, skv)
    cache_position = torch.tensor(pos)
    mask = torch.arange(skv)[None, :] <= cache_position[:, None]  # [S_q, S_kv]
    out = sdpa.make_attention(name)(q, k, v, mask, D**-0.5)  # [B, H, S_q, D]
    assert out.shape == (B, H, sq, D)

    module = torch.nn.Module()
    module.num_key_value_groups, module.training = H // HKV, False
    additive = torch.zeros(sq, skv).masked_fill(~mask, torch.finfo(torch.float32).min)[None, None]
    ref, _ = eager_attention_forward(module, q, k, v, additive, scaling=D**-0.5)  # [B, S_q, H, D]
    torch.testing.assert_close(out.transpose(1, 2), ref, atol=1e-5, rtol=1e-5)


def test_masked_slots_do_not_leak():
    """Garbage in unfilled static-cache slots must not change the output."""
    q, k, v = _qkv(1, 12)
    mask = torch.arange(12)[None, :] <= torch.tensor([5])[:, None]
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:], v2[:, :, 6:] = 1e3, -1e3
    for name in MASKED:
        att = sdpa.make_attention(name)
        torch.testing.assert_close(att(q, k, v, mask, 0.25), att(q, k2, v2, mask, 0.25))


@pytest.mark.parametrize("cache_name", FUNCTIONAL)
def test_cache_updates_match_transformers_caches(cache_name):
    """Step by step, our functional caches hold what transformers' StaticCache (fixed
    capacity) and DynamicCache (growing) hold for the same keys and values."""
    from transformers import DynamicCache, LlamaConfig, StaticCache

    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=D,
        num_hidden_layers=1,
        max_position_embeddings=64,
    )
    ours = kv_cache.make_kv_cache(cache_name)
    theirs = StaticCache(config=cfg, max_cache_len=12) if cache_name == "static" else DynamicCache(config=cfg)
    g = torch.Generator().manual_seed(1)
    prefix = torch.randn(B, HKV, 5, D, generator=g)  # a prefilled context of 5 positions
    k = v = ours.from_prefix(prefix, 12)
    ref_k, _ = theirs.update(prefix, prefix, 0, cache_kwargs={"cache_position": torch.arange(5)})
    for pos in range(5, 9):  # four decode steps
        new = torch.randn(B, HKV, 1, D, generator=g)
        k, v = ours.update(k, v, new, new, torch.tensor([pos]))
        ref_k, ref_v = theirs.update(new, new, 0, cache_kwargs={"cache_position": torch.tensor([pos])})
        torch.testing.assert_close(k, ref_k)
        torch.testing.assert_close(v, ref_v)
