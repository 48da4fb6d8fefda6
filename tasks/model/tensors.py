"""numpy <-> torch across every dtype phasesweep runs, bfloat16 included.

numpy has no bfloat16: a bfloat16 tensor is stored as its raw 16 bits (a uint16 view) and
its dtype is recorded beside it (meta.json `input_dtypes`), so nothing is ever rounded
through float32 on its way to a runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host copy; bfloat16 as its uint16 bits."""
    import torch  # lazy: torch, only in a job's process

    t = t.detach().cpu().contiguous()
    return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def to_torch(a: np.ndarray, dtype: str | None = None) -> torch.Tensor:
    """The tensor `a` holds; `dtype` "bfloat16" reads uint16 bits as bfloat16."""
    import torch  # lazy: torch, only in a job's process

    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def logits_numpy(t: torch.Tensor) -> np.ndarray:
    """Logits compared in float32, whatever the model's dtype."""
    return t.detach().float().cpu().numpy()


def as_float32(a: np.ndarray) -> np.ndarray:
    """float32 values of an output: bfloat16 bits (uint16) widened exactly, others cast."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)
