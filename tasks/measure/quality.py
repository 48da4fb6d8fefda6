"""Quality beside speed: the text it is measured on, and the metrics (numpy only).

A variant's next-token distributions are compared with those of the float32, unquantised
eager model of the same checkpoint or preset on the same tokens: KL divergence
KL(reference || variant) and top-1 agreement, and, when the tokens are real text, the
perplexity of both on the tokens that followed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The text that ships with Python, split once here: scripts/train_tiny.py trains on the first
# part, quality is measured by default on the rest (the held-out part).
HELD_OUT_SHARE = 0.10
QUALITY = "quality.npz"  # the export entry's quality inputs and reference (tasks/phases/_quality.py)


def corpus() -> str:
    """The standard library's documentation topics (pydoc_data, about 465k characters), in key order."""
    from pydoc_data.topics import topics  # lazy: a 465k-character text, only when quality is measured

    return "\n\n".join(topics[k] for k in sorted(topics))


def split(text: str, held_out: float = HELD_OUT_SHARE) -> tuple[str, str]:
    """(train, held-out): the last `held_out` share of the text, cut at a paragraph boundary."""
    at = int(len(text) * (1 - held_out))
    cut = text.find("\n\n", at)
    cut = at if cut < 0 else cut
    return text[:cut], text[cut:].lstrip("\n")


def quality_text(path: str | None) -> str:
    """bench.quality_text: a UTF-8 text file, or null for the held-out part of corpus()."""
    if path is None:
        return split(corpus())[1]
    return Path(path).read_text(encoding="utf-8")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the last axis, in float64 (half-precision logits would round the KL of a
    float16 variant to noise)."""
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def metrics(logits: np.ndarray, ref_logprobs: np.ndarray, targets: np.ndarray | None) -> dict[str, float]:
    """Quality of `logits` [N, V] against the reference's log-probabilities [N, V] of the same
    N positions; `targets` [N] the tokens that followed (None: synthetic tokens, where a
    perplexity means nothing). KL is per position, averaged, in nats."""
    if logits.shape != ref_logprobs.shape:
        raise ValueError(f"logits {logits.shape} and reference {ref_logprobs.shape} differ")
    lp = log_softmax(logits)
    ref = log_softmax(ref_logprobs)  # normalised again in float64: float32 storage leaves ~1e-7 of KL
    p_ref = np.exp(ref)
    kl = np.sum(p_ref * (ref - lp), axis=-1)
    out = {
        "quality_kl": float(np.mean(np.maximum(kl, 0.0))),  # >= 0; rounding can make a tiny negative
        "quality_kl_max": float(max(np.max(kl), 0.0)),
        "quality_top1": float(np.mean(lp.argmax(-1) == ref.argmax(-1))),
        "quality_tokens": float(len(lp)),
    }
    if targets is not None:
        rows = np.arange(len(targets))
        ppl = float(np.exp(-np.mean(lp[rows, targets])))
        ppl_ref = float(np.exp(-np.mean(ref[rows, targets])))
        out.update(quality_ppl=ppl, quality_ppl_ref=ppl_ref, quality_ppl_increase=ppl / ppl_ref - 1.0)
    return out
