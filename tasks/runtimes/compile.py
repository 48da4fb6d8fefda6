"""torch.compile (inductor) of the same prefill/decode graph modules eager runs.

Compilation happens in load(), on the phase's real inputs, and is reported on its own as
`compile_seconds`, so the measured latencies are steady state only.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch._inductor.config

from tasks.runtimes.eager import TorchSession, build_module, set_threads
from tasks.specs import BenchSpec


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    set_threads(spec)
    module = build_module(spec)
    options = spec.backend_options
    cold = options.get("cold_cache", True)
    if cold:  # compile_seconds then means a first compile, not a lookup in inductor's disk cache
        torch._inductor.config.force_disable_caches = True
    compiled = torch.compile(
        module, backend="inductor", mode=options.get("mode"), fullgraph=True, dynamic=options.get("dynamic")
    )
    session = TorchSession(compiled, spec, meta)
    t0 = time.perf_counter()
    session.run(feeds)
    session.metrics["compile_seconds"] = time.perf_counter() - t0
    session.info.update(compile_mode=options.get("mode") or "default", compile_cold_cache=cold)
    return session
