"""Test-only backend `spin`: a runtime for the existing format `none` that busy-waits
`spin_us` per timed call: a known slowdown.

It runs the eager graph module and, in every call the benchmark times (Session.bind),
busy-waits `spin_us` microseconds first; parity (run / run_steps) is eager's, unspun. So a
sweep with spin_us=S measures eager's latency plus S, and tests can check what the
measurement and the regression verdict make of a slowdown whose size they know.

Not part of phasesweep: it lives here, outside conf/ and tasks/, to prove that a runtime is
one module plus one yaml. To use it, put this folder on PYTHONPATH (Ray workers and the
benchmark processes they spawn import it by name) and its conf/ on Hydra's search path:

    PYTHONPATH=tests/spin_backend python sweep.py backend=spin backend.options.spin_us=300 \\
        'hydra.searchpath=[file://'$PWD'/tests/spin_backend/conf]'
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tasks.specs import at_least

LIBRARIES = ("torch", "transformers")
MEMORY_FACTOR = 1.5
DTYPES = {"cpu": ("float32", "float16", "bfloat16")}  # model dtypes it runs, by device


@dataclass(frozen=True)
class Options:
    spin_us: int = 0  # microseconds each timed call busy-waits before the eager call

    def __post_init__(self) -> None:
        at_least("backend.options.spin_us", self.spin_us, 0)


def load(spec, meta, feeds):
    from tasks.runtimes import eager

    session = eager.load(spec, meta, feeds)
    spin_ns = Options(**spec.runtime_options).spin_us * 1000
    bind = session.bind

    def spinning_bind(feeds):
        call = bind(feeds)

        def spun():
            end = time.perf_counter_ns() + spin_ns
            while time.perf_counter_ns() < end:
                pass
            return call()

        return spun

    session.bind = spinning_bind
    session.info["spin_us"] = spin_ns // 1000
    return session
