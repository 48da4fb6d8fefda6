"""Test-only backend `spin`: a runtime for the existing format `none` that busy-waits
`spin_us` per timed call: a known slowdown.

It runs the eager graph module and, in every call the benchmark times (Session.bind),
busy-waits `spin_us` microseconds first; parity (run / run_steps) is eager's, unspun. So a
sweep with spin_us=S measures eager's latency plus S, and tests can check what the
measurement and the regression verdict make of a slowdown whose size they know.

`fault` (none, raise, hang, exit, segv, oom) makes load() fail the way a broken runtime
does, for the fault-injection suite (tests/test_faults.py): raise an exception, hang, call
os._exit(3), segfault, or allocate until memory runs out. If SPIN_PID_FILE is set, load()
first writes its process id there (a test finds the benchmark's process, and its worker).

Not part of phasesweep: it lives here, outside conf/ and tasks/, to prove that a runtime is
one module plus one yaml. To use it, put this folder on PYTHONPATH (Ray workers and the
benchmark processes they spawn import it by name) and its conf/ on Hydra's search path:

    PYTHONPATH=tests/spin_backend python sweep.py backend=spin backend.options.spin_us=300 \\
        'hydra.searchpath=[file://'$PWD'/tests/spin_backend/conf]'
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from tasks.contract import Runtime
from tasks.runtimes.eager import EagerRuntime
from tasks.specs import at_least, choice

FAULTS = ("none", "raise", "hang", "exit", "segv", "oom")
OOM_LIMIT_BYTES = 2 << 30  # the address space the `oom` fault may fill

@dataclass(frozen=True)
class Options:
    spin_us: int = 0  # microseconds each timed call busy-waits before the eager call
    fault: str = "none"  # how load() fails: none, raise, hang, exit, segv, oom

    def __post_init__(self) -> None:
        at_least("backend.options.spin_us", self.spin_us, 0)
        choice("backend.options.fault", self.fault, FAULTS)


def inject(fault: str) -> None:
    """Fail as a broken runtime would, in the benchmark's own process."""
    if fault == "raise":
        raise RuntimeError("injected fault")
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "exit":
        os._exit(3)
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)  # the signal is delivered before this returns
    if fault == "oom":
        # Bounded on purpose: the address space is capped at OOM_LIMIT_BYTES first, so the
        # allocation fails fast with MemoryError instead of filling a shared machine until
        # the kernel's OOM killer picks a victim (perhaps not this process).
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = OOM_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(OOM_LIMIT_BYTES, hard)
        vm = _vm_size()
        resource.setrlimit(resource.RLIMIT_AS, (max(limit, vm + (256 << 20)), hard))
        hoard = []
        while True:
            hoard.append(bytearray(64 << 20))


def _vm_size() -> int:
    """This process's current address space in bytes (torch alone maps a few hundred MB)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


class SpinRuntime(Runtime):
    LIBRARIES = ("torch", "transformers")
    # what its fork server imports once for its benchmarks (tasks/worker/forks.py): eager's, and
    # this module itself; without it each benchmark imported torch and transformers after its fork
    PRELOAD = (*EagerRuntime.PRELOAD, "spin_runtime")
    MODELS = True  # it builds eager's models: its server imports the modelling modules of their families
    DTYPES = {"cpu": ("float32", "float16", "bfloat16")}  # model dtypes it runs, by device
    QUANTS = EagerRuntime.QUANTS  # eager's module, quantised as eager does
    Options = Options

    def load(self, spec, meta, feeds):
        return load(spec, meta, feeds)


def load(spec, meta, feeds):
    from tasks.runtimes import eager

    options = Options(**spec.runtime_options)
    if os.environ.get("SPIN_PID_FILE"):
        with open(os.environ["SPIN_PID_FILE"], "a") as f:
            f.write(f"{os.getpid()} {spec.variant}\n")
    inject(options.fault)
    session = eager.RUNTIME.load(spec, meta, feeds)
    spin_ns = options.spin_us * 1000
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


RUNTIME = SpinRuntime()
