"""torch.compile (inductor) of the same prefill/decode graph modules eager runs.

Compilation happens in load(), on the phase's real inputs, and is reported on its own as
`compile_seconds`, so the measured latencies are steady state only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.runtimes.eager import PRELOAD as EAGER_PRELOAD
from tasks.runtimes.eager import TorchSession, build_module, set_threads
from tasks.specs import PAST, BenchSpec, choice

LIBRARIES = ("torch", "transformers")
PRELOAD = (*EAGER_PRELOAD, "torch._dynamo", "torch._inductor.config")  # what a fork server imports (tasks/worker/forks.py)
MEMORY_FACTOR = 1.5
# model dtypes it runs, by device: other combinations are skipped at plan time
DTYPES = {"cpu": ("float32", "float16", "bfloat16"), "cuda": ("float32", "float16", "bfloat16")}
PROFILER = "torch.profiler around the compiled module, after the timed loop in the same session"
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Options:
    mode: str | None = None  # None | reduce-overhead | max-autotune | ...
    dynamic: bool | None = None  # None: torch decides (recompiles once as dynamic if shapes change)
    cold_cache: bool = True  # True: inductor's caches off, so compile_seconds is a real first compile

    def __post_init__(self) -> None:
        choice("backend.options.mode", self.mode, MODES)


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_counts() -> tuple[int, int]:
    """Dynamo's graphs compiled and frames it was asked to convert: a recompile (a guard
    miss) moves the second even where it ends without a new graph."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(counters["frames"]["total"])


class CompiledSession(TorchSession):
    """A TorchSession whose module is compiled. A growing (dynamic) KV cache is declared
    dynamic in its sequence dimension up front, so consecutive decode steps reuse one
    graph; recompiles are counted, and inside the timed region a recompile is an error."""

    def __init__(self, module, spec: BenchSpec, meta: dict[str, Any]):
        super().__init__(module, spec, meta)
        self.dynamic_cache = spec.model.kv_cache == "dynamic"
        self.compiled_after_load = 0

    def recompiles(self) -> int:
        """Graphs compiled since load() compiled the first."""
        return _graphs_compiled() - self.compiled_after_load

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list:
        import torch

        tensors = super()._tensors(feeds)
        if self.dynamic_cache:
            for name, t in zip(feeds, tensors, strict=True):
                if name.startswith(PAST):
                    torch._dynamo.mark_dynamic(t, 2)  # [B, H_kv, S, D]: S grows step by step
        return tensors

    @contextmanager
    def timed_region(self) -> Iterator[None]:
        """Timed calls must run the graph compiled before them: Dynamo's counters are read
        before and after, and a recompile in between raises (the variant fails). Counters,
        not set_stance("fail_on_recompile"): that stance builds a new callback on every call
        (with per-call inference mode, ~5% on a tiny model's ~0.4 ms decode step)."""
        before = _compile_counts()
        with super().timed_region():  # inference mode, once
            yield
        if _compile_counts() != before:
            raise RuntimeError(
                "torch.compile recompiled inside the timed region (first call or timed loop): "
                "the timings are not of one graph"
            )


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    import torch
    import torch._inductor.config

    set_threads(spec)
    module = build_module(spec)
    opts = Options(**spec.runtime_options)
    if opts.cold_cache:  # compile_seconds then means a first compile, not a lookup in inductor's disk cache
        torch._inductor.config.force_disable_caches = True
    compiled = torch.compile(module, backend="inductor", mode=opts.mode, fullgraph=True, dynamic=opts.dynamic)
    session = CompiledSession(compiled, spec, meta)
    before = _graphs_compiled()
    t0 = time.perf_counter()
    session.run(feeds)
    session.metrics["compile_seconds"] = time.perf_counter() - t0
    session.metrics["compiled_graphs"] = _graphs_compiled() - before
    session.compiled_after_load = _graphs_compiled()
    session.info.update(
        compile_mode=opts.mode or "default",
        compile_cold_cache=opts.cold_cache,
        compile_dynamic_cache=session.dynamic_cache,
    )
    return session
