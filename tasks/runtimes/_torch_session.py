"""What the sessions whose outputs are torch tensors (eager, compile, ExecuTorch) share."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.measure.session import Session
from tasks.model.tensors import logits_numpy, to_numpy


class TorchOutputSession(Session):
    """A session whose step returns torch tensors: logits in float32, caches in their own
    dtype (bfloat16 as uint16 bits)."""

    def to_host(self, logits: Any) -> np.ndarray:
        return logits_numpy(logits)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        logits, *rest = self.step(self.place(self.prepare(feeds)))
        return [self.to_host(logits), *map(to_numpy, rest)]
