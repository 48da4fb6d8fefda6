"""The session every runtime's load() returns. Sessions speak numpy at their edges; a runtime
overrides run and bind, and where its calls can stay on the device, place/step/to_host."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from tasks.specs import CONTEXT, PAST


class Staged(NamedTuple):
    """One step with its inputs already handed to the runtime: `call()` is the runtime's call
    alone, as a benchmark times a bound call; `outputs()` the call's outputs, placed, logits first."""

    call: Callable[[], object]
    outputs: Callable[[], list[Any]]


class Session:
    output_names: list[str]
    info: dict[str, Any]  # settings recorded as params: threads, providers, ...
    metrics: dict[str, float]  # one-off costs measured while loading, e.g. compile_seconds

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One call on host inputs; outputs in output_names order, logits as float32."""
        raise NotImplementedError

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """A zero-argument call on inputs already placed, so the timed loop measures only the call."""
        raise NotImplementedError

    def sync(self) -> None:
        """Wait until the last call's work is done."""

    def timer(self) -> Callable[[Callable[[], object]], int] | None:
        """`timer(step) -> ns` of the runtime's own (CUDA events), or None for the host clock."""
        return None

    def device_metrics(self) -> dict[str, float]:
        """Device counters read after timing, e.g. cuda_peak_allocated_mb."""
        return {}

    def recompiles(self) -> int | None:
        """Graphs compiled since load() (torch.compile); None where the runtime does not compile."""
        return None

    @contextmanager
    def timed_region(self) -> Iterator[None]:
        """Entered around the first call and the whole timed loop (torch: inference mode)."""
        yield

    # decode's contract, the primitives: inputs in the runtime's own form (device tensors, OrtValues)
    def place(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        return dict(arrays)

    def step(self, inputs: dict[str, Any]) -> list[Any]:
        """One call on placed inputs; outputs placed, logits first."""
        return self.run(inputs)

    def staged(self, inputs: dict[str, Any]) -> Staged:
        """step() in two parts, so a loop can time the call as a benchmark does and count the
        handing over of its inputs (a runtime's binding, copies out) as its own time."""
        held: list[Any] = [None]  # the last call's outputs only

        def call() -> None:
            held[0] = self.step(inputs)

        return Staged(call, lambda: held[0])

    def to_host(self, logits: Any) -> np.ndarray:
        return logits

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's own inputs of `feeds`. Feeds holding CONTEXT are an in-graph cache's:
        the program's cache is first filled with those tokens, one call at positions 0..C-1.
        Every run, bind and run_steps starts here."""
        if CONTEXT not in feeds:
            return feeds
        inputs = {n: a for n, a in feeds.items() if n != CONTEXT}
        ctx = feeds[CONTEXT]  # [B, C]
        self.step(self.place({"input_ids": ctx, "cache_position": np.arange(ctx.shape[1], dtype=np.int64)}))
        return inputs

    def run_steps(self, feeds: dict[str, np.ndarray], tokens: np.ndarray, start: int) -> list[np.ndarray]:
        """Consecutive decode steps of `tokens` [B, N] from position `start`, each fed the cache
        the step before returned (present.i becomes past_key_values.i; an in-graph cache keeps
        its own): each step's logits."""
        feeds = self.prepare(feeds)
        past = [n for n in feeds if n.startswith(PAST)]
        inputs = self.place(feeds)
        logits = []
        for t in range(tokens.shape[1]):
            ids = np.ascontiguousarray(tokens[:, t : t + 1])
            inputs.update(self.place({"input_ids": ids, "cache_position": np.array([start + t], dtype=np.int64)}))
            first, *present = self.step(inputs)
            logits.append(self.to_host(first))
            inputs.update(zip(past, present, strict=True))
        return logits
