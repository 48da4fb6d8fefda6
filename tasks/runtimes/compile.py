"""torch.compile (inductor) of the same prefill/decode graph modules eager runs.

Compilation happens in load(), on the phase's real inputs, and is reported on its own as
`compile_seconds`, so the measured latencies are steady state only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.runtimes.eager import TorchSession, build_module, set_threads
from tasks.specs import BenchSpec, choice

LIBRARIES = ("torch", "transformers")
MEMORY_FACTOR = 1.5
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Options:
    mode: str | None = None  # None | reduce-overhead | max-autotune | ...
    dynamic: bool | None = None  # None: torch decides (recompiles once as dynamic if shapes change)
    cold_cache: bool = True  # True: inductor's caches off, so compile_seconds is a real first compile

    def __post_init__(self) -> None:
        choice("backend.options.mode", self.mode, MODES)


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    import torch
    import torch._inductor.config

    set_threads(spec)
    module = build_module(spec)
    opts = Options(**spec.runtime_options)
    if opts.cold_cache:  # compile_seconds then means a first compile, not a lookup in inductor's disk cache
        torch._inductor.config.force_disable_caches = True
    compiled = torch.compile(module, backend="inductor", mode=opts.mode, fullgraph=True, dynamic=opts.dynamic)
    session = TorchSession(compiled, spec, meta)
    t0 = time.perf_counter()
    session.run(feeds)
    session.metrics["compile_seconds"] = time.perf_counter() - t0
    session.info.update(compile_mode=opts.mode or "default", compile_cold_cache=opts.cold_cache)
    return session
