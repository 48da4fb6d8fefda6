"""One module per phase; nothing outside these modules branches on a phase's name.

A new phase is one module here plus one yaml in conf/phase/. Each module is importable
without torch (the driver calls its torch-free half) and provides:

  normalize(phase, kv_cache) -> PhaseSpec     drop unused fields, resolve derived ones, so
                                              equal work gets equal keys and names
  check(phase, dims) -> None                  every check the config and the model's
                                              dimensions decide (raises ConfigError)
  tokens_per_call(phase) -> int               tokens per sequence one timed call processes
  series(phase) -> tuple[int, ...]            steps of a series measured after the headline call
                                              from the same export (decode: phase.depths), or ()
  io_names(phase, layers, kv_cache) -> (inputs, outputs)   graph input/output names, in call order
  make_data(model, phase, kv_cache, dims) -> PhaseData   inputs and eager reference (torch), and
                                              each series step's in PhaseData.series
  build_graph(model, phase, family, kv_cache, attention) -> nn.Module   the graph to export (torch)
  check_parity(session, phase, feeds, parity, atol) -> dict   exported vs reference
  extra_metrics(phase=..., **timing) -> dict   phase-specific metrics after timing

  NAMING_KEYS: tuple[str, ...]                params that set its variants apart in their names
                                              even when no one swept them (captured: the shapes the
                                              application chose; decode: a depth per export), or ()
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType

from tasks.specs import ConfigError


@cache
def phase_names() -> tuple[str, ...]:
    """The phases this installation offers: the public modules of this package."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def phase_module(name: str) -> ModuleType:
    if name not in phase_names():
        raise ConfigError(f"phase.name={name!r} is not allowed; choose one of: {', '.join(phase_names())}")
    return importlib.import_module(f"{__name__}.{name}")

