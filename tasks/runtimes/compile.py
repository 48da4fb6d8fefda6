"""torch.compile (inductor) of the graph modules eager runs. load() compiles on the phase's
real inputs and reports it as compile_seconds, so the timed calls are steady state."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from tasks.runtimes.eager import EagerRuntime, TorchSession, build_module, set_threads
from tasks.specs import PAST, BenchSpec, choice

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Options:
    mode: str | None = None  # None | reduce-overhead | max-autotune | ...
    dynamic: bool | None = None  # None: torch decides (recompiles once as dynamic if shapes change)
    cold_cache: bool = True  # True: compile caches off, so compile_seconds is a real first compile

    def __post_init__(self) -> None:
        choice("backend.options.mode", self.mode, MODES)


@cache
def dynamo_counters() -> Any:
    """Dynamo's counters (private: torch has no public count of compiled graphs), or None with
    a warning where an upgrade moved them: recompiles then go uncounted, and the timed region
    uses the public fail_on_recompile stance instead."""
    try:
        # lazy: torch, only in a job's process
        from torch._dynamo.utils import counters

        int(counters["stats"]["unique_graphs"]) + int(counters["frames"]["total"])
        return counters
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:
        warnings.warn(f"torch._dynamo.utils.counters not found ({e}): compile recompiles are not counted", stacklevel=2)
        return None


def _compile_counts() -> tuple[int, int] | None:
    """Graphs compiled and frames Dynamo was asked to convert (a guard miss moves the second
    even where it makes no new graph); None where uncounted."""
    c = dynamo_counters()
    return None if c is None else (int(c["stats"]["unique_graphs"]), int(c["frames"]["total"]))


def _graphs_compiled() -> int | None:
    counts = _compile_counts()
    return None if counts is None else counts[0]


class CompiledSession(TorchSession):
    """A growing (dynamic) cache is marked dynamic in its sequence dim, so decode steps share
    one graph; a recompile inside the timed region fails the variant."""

    def __init__(self, module, spec: BenchSpec, meta: dict[str, Any]):
        super().__init__(module, spec, meta)
        self.dynamic_cache = spec.model.kv_cache == "dynamic"
        self.compiled_after_load = 0

    def recompiles(self) -> int | None:
        """Graphs compiled since load() compiled the first."""
        graphs = _graphs_compiled()
        return None if graphs is None else graphs - self.compiled_after_load

    def place(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        # lazy: torch, only in a job's process
        import torch

        tensors = super().place(arrays)
        if self.dynamic_cache:
            for name, t in tensors.items():
                if name.startswith(PAST):
                    torch._dynamo.mark_dynamic(t, 2)  # documented API; [B, H_kv, S, D]: S grows
        return tensors

    @contextmanager
    def timed_region(self) -> Iterator[None]:
        """Counters read before and after rather than set_stance("fail_on_recompile"), which
        adds work to every call; the stance where the counters are gone."""
        # lazy: torch, only in a job's process
        import torch

        before = _compile_counts()
        if before is None:
            with super().timed_region(), torch.compiler.set_stance("fail_on_recompile"):
                yield
            return
        with super().timed_region():
            yield
        if _compile_counts() != before:
            raise RuntimeError(
                "torch.compile recompiled inside the timed region (first call or timed loop): "
                "the timings are not of one graph"
            )


class CompileRuntime(EagerRuntime):
    """Eager's modules, compiled: what eager refuses, this refuses too."""

    PRELOAD = (*EagerRuntime.PRELOAD, "torch._dynamo")
    PROFILER = "torch.profiler around the compiled module, after the timed loop in the same session"
    Options = Options

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
        return load(spec, meta, feeds)


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    # lazy: torch, only in a job's process
    import torch

    set_threads(spec)
    module = build_module(spec)
    opts = Options(**spec.runtime_options)
    if opts.cold_cache:
        torch.compiler.config.force_disable_caches = True
    compiled = torch.compile(module, backend="inductor", mode=opts.mode, fullgraph=True, dynamic=opts.dynamic)
    session = CompiledSession(compiled, spec, meta)
    before = _graphs_compiled()
    t0 = time.perf_counter()
    session.run(feeds)
    session.metrics["compile_seconds"] = time.perf_counter() - t0
    if before is not None:
        session.compiled_after_load = _graphs_compiled()
        session.metrics["compiled_graphs"] = session.compiled_after_load - before
    session.info.update(
        compile_mode=opts.mode or "default",
        compile_cold_cache=opts.cold_cache,
        compile_dynamic_cache=session.dynamic_cache,
    )
    return session


RUNTIME = CompileRuntime()
