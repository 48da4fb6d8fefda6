"""One module per runtime (a backend's runner). A runtime for an existing export format is
one module here (or any importable module the yaml's `runtime` names) plus one yaml in
conf/backend/. Each is importable without torch (the driver reads its facts) and provides:

  LIBRARIES: tuple[str, ...]   distributions whose versions change its measurements (bench key)
  MEMORY_FACTOR: float         a benchmark's peak memory, as a multiple of the weight bytes
  DTYPES: dict[str, tuple]     model dtypes it runs, by device (DTYPE_NOTE: why others not)
  Options                      a dataclass of its typed options (backend.options);
                               __post_init__ checks values and raises ConfigError
  load(spec, meta, feeds) -> Session   a subclass of tasks.measure.session.Session
  PROFILER: str                (optional) the profiler its session's profile() uses
                               (bench.profile=true needs one; tasks/measure/profiles.py)
  PRELOAD: tuple[str, ...]     (optional) modules its fork server imports once (tasks/worker/forks.py)
  QUANTS: dict[str, tuple]     (optional) model.quant values it runs, by device (absent: ("none",));
                               others are planned as skipped with QUANT_NOTE (a str, or {device: str})
  REFUSES: dict                (optional) {config key: {value: why}}: model choices it cannot
                               run, planned as skipped with the reason (as the format's);
                               why may be {device: why} where only some devices cannot
"""

from __future__ import annotations

from types import ModuleType

from tasks.registry import load_module


def profiled_runtimes() -> list[str]:
    """The runtimes of this package that can profile (bench.profile=true)."""
    import pkgutil

    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return sorted(n for n in names if hasattr(runtime_module(n), "PROFILER"))


def runtime_module(name: str) -> ModuleType:
    """`onnxruntime` -> tasks.runtimes.onnxruntime; a dotted name is imported as it is."""
    return load_module("backend.runtime", name, __name__)
