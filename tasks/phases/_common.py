"""What every phase module shares: the generated data's container, seeded tokens, and the
window check. torch is imported inside the functions that need it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tasks.model.tensors import to_torch
from tasks.specs import CONTEXT, ConfigError

if TYPE_CHECKING:
    import torch

    from tasks.specs import PhaseSpec


@dataclass
class PhaseData:
    feeds: dict[str, np.ndarray]  # the timed call's inputs, by graph input name, in call order (+ CONTEXT)
    parity: dict[str, np.ndarray]  # reference outputs (and step tokens) the parity check reads
    dims: dict[str, int]
    dtypes: dict[str, str] = field(default_factory=dict)  # inputs whose numpy form is not their dtype (bfloat16)
    series: dict[int, PhaseData] = field(default_factory=dict)  # step -> the data of another call of the series (decode's depths)

    def example_args(self) -> tuple[torch.Tensor, ...]:
        return tuple(to_torch(a, self.dtypes.get(n)) for n, a in self.feeds.items() if n != CONTEXT)

    def shapes(self) -> dict[str, list[int]]:
        return {name: list(a.shape) for name, a in self.feeds.items()}


def tokens(gen: torch.Generator, vocab: int, shape: tuple[int, ...]) -> torch.Tensor:
    import torch  # lazy: torch, only in a job's process

    return torch.randint(0, vocab, shape, generator=gen, dtype=torch.int64)


def check_span(key: str, span: int, dims: dict[str, int]) -> None:
    """`span` positions must fit the model's maximum positions (a sliding window does not
    limit it: sliding layers mask the keys older than their window)."""
    limit = dims["max_positions"]
    if span > limit:
        raise ConfigError(f"{key}={span} exceeds the model's max_position_embeddings={limit}")


def synthetic_only(phase: PhaseSpec) -> None:
    """phase.app belongs to phase=captured: a synthetic phase refuses it rather than ignore it."""
    if phase.app is not None:
        raise ConfigError(
            f"phase.app={phase.app!r} is for phase=captured; phase={phase.name} generates its own inputs "
            "(choose phase=captured to run the application)"
        )
