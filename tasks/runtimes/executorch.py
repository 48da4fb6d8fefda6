"""ExecuTorch: the .pte runs in the ExecuTorch runtime (XNNPACK delegate) from Python.
`import executorch.runtime` takes seconds: it happens in the session, not at import."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tasks.contract import Runtime
from tasks.measure.profiles import WARMUP, add, top_ops
from tasks.measure.session import Staged
from tasks.model.tensors import to_torch
from tasks.runtimes._torch_session import TorchOutputSession
from tasks.specs import BenchSpec


def threadpool(portable_lib: Any, name: str) -> Any:
    """XNNPACK's thread pool is reachable only through these private pybindings (no public API
    sets it): a clear error, not a wrong thread count, if an upgrade removes them."""
    fn = getattr(portable_lib, name, None)
    if fn is None:
        raise RuntimeError(f"executorch's portable_lib has no {name}: bench.threads cannot set XNNPACK's threads")
    return fn


class PteSession(TorchOutputSession):
    def __init__(self, path: Path, spec: BenchSpec, meta: dict[str, Any]):
        # lazy: executorch, only in a job's process
        from executorch.extension.pybindings import portable_lib

        # lazy: executorch, only in a job's process
        from executorch.runtime import Runtime

        if spec.device != "cpu":
            raise RuntimeError(f"device={spec.device}: the executorch backend runs on cpu only")
        if spec.bench.threads:
            threadpool(portable_lib, "_unsafe_reset_threadpool")(spec.bench.threads)
        if meta["details"].get("custom_ops", "none") != "none":  # llama::update_cache, custom_sdpa kernels
            # lazy: it imports torch or its kin, which this module's importers (the driver) must not
            from tasks.model.sdpa import load_llama_ops

            load_llama_ops()
        self.path = path
        self.method = Runtime.get().load_program(path).load_method("forward")
        self.output_names = meta["output_names"]
        self.dtypes: dict[str, str] = meta.get("input_dtypes", {})
        self.info = {"xnnpack_threads": threadpool(portable_lib, "_threadpool_get_thread_count")()}
        self.metrics: dict[str, float] = {}

    def place(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        return {n: to_torch(a, self.dtypes.get(n)) for n, a in arrays.items()}

    def step(self, inputs: dict[str, Any]) -> list[Any]:
        staged = self.staged(inputs)
        staged.call()
        return staged.outputs()

    def staged(self, inputs: dict[str, Any]) -> Staged:
        """The call executes the method; its outputs are copied out of the method's memory,
        which its next call reuses."""
        args, execute, held = list(inputs.values()), self.method.execute, [None]  # the last call's outputs only

        def call() -> None:
            held[0] = execute(args)

        def outputs() -> list[Any]:
            logits, *present = held[0]
            return [logits, *(t.clone() for t in present)]

        return Staged(call, outputs)

    def bind(self, feeds: dict[str, np.ndarray]):
        inputs = list(self.place(self.prepare(feeds)).values())
        method = self.method
        return lambda: method.execute(inputs)

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """Portable kernels and XNNPACK operators, from an ETDump of a second load with tracing on."""

        # lazy: executorch, only in a job's process
        from executorch.devtools import Inspector

        # lazy: executorch, only in a job's process
        from executorch.devtools.inspector import TimeScale

        # lazy: executorch, only in a job's process
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(self.path, enable_etdump=True, debug_buffer_size=0)
        method, timed = program.load_method("forward"), self.method
        self.method = method  # an in-graph cache is filled in the traced program's own buffers
        inputs = list(self.place(self.prepare(feeds)).values())
        self.method = timed
        for _ in range(WARMUP + calls):
            method.execute(inputs)
        etdump, debug = folder / "etdump.etdp", folder / "debug.bin"
        program.write_etdump_result_to_file(str(etdump), str(debug))
        with warnings.catch_warnings():  # no debug buffer was asked for: timings only
            warnings.filterwarnings("ignore", message="Output Buffer not found")
            inspector = Inspector(etdump_path=str(etdump), target_time_scale=TimeScale.US)
        events = [
            (event.name, list(event.perf_data.raw))
            for block in inspector.event_blocks
            if block.name == "Execute"
            for event in block.events
            if event.perf_data is not None
        ]
        return profile_rows(events, WARMUP)


_WRAPPERS = {"Method::execute", "DELEGATE_CALL", "OPERATOR_CALL"}  # spans around other events
_INSTANCE = re.compile(r"\s#\d+$")  # XNNPACK numbers its operators: "... GEMM #2"


def op_name(name: str) -> str:
    """`native_call_expand_copy.out` -> `expand_copy (portable)`; a custom op's kernel
    (`llama::custom_sdpa.out`) -> `llama::custom_sdpa (custom op)`; an XNNPACK operator keeps
    its name, without its instance number, marked `(xnnpack)`."""
    if name.startswith("native_call_"):
        return name.removeprefix("native_call_").removesuffix(".out").split(".")[0] + " (portable)"
    if "::" in name:  # a registered kernel outside the delegate, by its op name
        return name.removesuffix(".out") + " (custom op)"
    return _INSTANCE.sub("", name) + " (xnnpack)"


def profile_rows(events: Iterable[tuple[str, list[float]]], warmup: int) -> list[dict[str, Any]]:
    """`events`: (name, one duration in us per execute call) of the ETDump's Execute block."""
    per_op: dict[str, tuple[int, float]] = {}
    call_us, calls = 0.0, 0
    for name, raw in events:
        timed = raw[warmup:]
        if name == "Method::execute":
            call_us, calls = call_us + sum(timed), calls + len(timed)
        elif name not in _WRAPPERS and timed:
            add(per_op, op_name(name), sum(timed), len(timed))
    return top_ops(per_op, calls, call_us)


class ExecutorchRuntime(Runtime):
    """Runs whatever the .pte holds (conf/backend/executorch.yaml: on the CPU): what ExecuTorch
    cannot make or run is the format's to say (tasks/export/executorch.py)."""

    LIBRARIES = ("executorch",)
    REQUIRES = ("executorch",)
    PRELOAD = ("executorch.runtime", "executorch.extension.pybindings.portable_lib")
    PROFILER = "ExecuTorch's ETDump, read with its Inspector, from a program loaded with it on"

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> PteSession:
        return PteSession(Path(spec.export_dir) / meta["artifact"], spec, meta)


RUNTIME = ExecutorchRuntime()
