"""What every phase's quality windows share (tasks/quality_windows.py makes and measures them): the
float32 reference's log-probabilities over a window's predicted positions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

LOGITS_BUDGET = 1 << 28  # bytes of reference logits in flight at once (a large vocabulary: fewer rows)


def reference_logprobs(ref: torch.nn.Module, ids: torch.Tensor, keep: int) -> np.ndarray:
    """log-probabilities [R, keep, V] (float32) of the last `keep` positions of each row of `ids` [R, L]."""
    import torch  # lazy: torch, only in a job's process

    rows = max(1, LOGITS_BUDGET // (keep * ref.config.vocab_size * 4))
    out = []
    with torch.inference_mode():
        for chunk in ids.split(rows):
            logits = ref(input_ids=chunk, logits_to_keep=keep).logits.float()
            out.append(torch.log_softmax(logits, -1).numpy())
    return np.concatenate(out)
