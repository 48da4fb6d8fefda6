"""The protocol every backend's session follows. Sessions speak numpy at their edges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


class Session(Protocol):
    """What `tasks.runtimes.<runtime>.load(spec, meta, feeds)` returns; `feeds` are the
    phase's inputs, for backends that specialise on them while loading (torch.compile)."""

    output_names: list[str]
    info: dict[str, Any]  # settings worth recording as params: threads, providers, ...
    metrics: dict[str, float]  # one-off costs measured while loading, e.g. compile_seconds

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One call with host inputs, outputs in output_names order (parity checks)."""

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """A zero-argument call with inputs already placed where the backend wants them
        (device memory, bound buffers), so the timed loop measures only the call."""

    def sync(self) -> None:
        """Wait until the last call's work is done (no-op on synchronous backends)."""

    def timer(self) -> Callable[[Callable[[], object]], int] | None:
        """A `timer(step) -> ns` of the backend's own (CUDA events), or None for the host clock."""

    def device_metrics(self) -> dict[str, float]:
        """Device counters read after measuring, e.g. cuda_peak_allocated_mb."""

    # optional: run_steps(feeds, tokens [B, N], start) -> N logits, consecutive decode steps
    # fed back on the device; parity uses it when present, else a host loop over run()
    # optional: timed_region() -> a context manager the harness enters around the first timed
    # call and around measure()'s whole loop; bind()'s call may rely on it (torch: inference
    # mode is entered there once, not per call; compile: a recompile inside it raises)
