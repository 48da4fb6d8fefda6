"""One module per runtime, each defining RUNTIME, an instance of a subclass of
tasks.contract.Runtime (what it needs, runs and refuses, and load(): see that class). A
runtime for an existing export format is one module here, or any importable module a yaml's
`runtime` names, plus one yaml in conf/backend/ (or on Hydra's search path)."""

from __future__ import annotations

from tasks.contract import Runtime
from tasks.registry import available, load_object


def profiled_runtimes() -> list[str]:
    """The runtimes of this package that can profile (bench.profile=true)."""
    return [n for n in available(__name__) if runtime_module(n).PROFILER is not None]


def runtime_module(name: str) -> Runtime:
    """The RUNTIME of `onnxruntime` (tasks.runtimes.onnxruntime) or of a dotted module path, as it is."""
    return load_object("backend.runtime", name, __name__, "RUNTIME", Runtime)
