"""The contract every export format and every runtime keeps: one class each, one object per module.

A format is a module of tasks/export/ (or any importable module a backend yaml's
`export_format` names) that defines `FORMAT`, an instance of a subclass of `ExportFormat`; a
runtime is a module of tasks/runtimes/ (or any importable module a yaml's `runtime` names)
that defines `RUNTIME`, an instance of a subclass of `Runtime`. tasks/registry.py loads it and
checks its type. Both are importable without torch: the driver reads their facts and asks
`refuses()` at plan time; the work (export, load) imports what it needs when called.

What each declares, in one place, with a default on the base:

  LIBRARIES     distributions whose versions change what it makes or measures (export/bench key)
  REQUIRES      distributions it needs installed: a missing one skips the point with `pip install`
  MEMORY_FACTOR its peak memory, as a multiple of the weight bytes
  Options       a frozen dataclass of its typed options (backend.export_options / backend.options);
                __post_init__ checks values and raises ConfigError
  PRELOAD       modules its fork server imports once (tasks/worker/forks.py)
  DTYPES        model.dtype values it handles, by device (DTYPE_NOTE: why not others)
  QUANTS        model.quant values it handles, by device (QUANT_NOTE: why not others, a str or
                {device: str}); a format makes them, a runtime runs them
  REFUSALS      single model choices it cannot handle (Refusal: model.kv_cache=update_cache, ...)
  limits(point) anything else it cannot do (a combination of choices): why, or None
  fixed_depth(point)  why its artifact or session serves one cache depth only (decode's
                phase.depths is then planned as one export per depth), or None: one export
                serves every depth its cache's capacity holds

`refuses(point)` asks all of these in that order and answers the first reason, or None; the
planner asks it of a point's runtime, then of its format, and skips the point with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.specs import DEVICES, DTYPES, QUANTS, BenchSpec, ModelSpec, PhaseSpec

if TYPE_CHECKING:
    import numpy as np

EVERY_DTYPE: Mapping[str, tuple[str, ...]] = dict.fromkeys(DEVICES, DTYPES)
EVERY_QUANT: Mapping[str, tuple[str, ...]] = dict.fromkeys(DEVICES, QUANTS)
NO_QUANT: Mapping[str, tuple[str, ...]] = dict.fromkeys(DEVICES, ("none",))


@dataclass(frozen=True)
class NoOptions:
    """Options of a format or runtime that takes none."""


@dataclass(frozen=True)
class Point:
    """What a format or runtime is asked about: one grid point, as the planner resolved it."""

    backend: str  # the backend's name (conf/backend/<name>.yaml), for the reason's text
    device: str
    model: ModelSpec | Any  # model.dtype, quant, quant_group, kv_cache, attention, family, ...
    phase: PhaseSpec
    export_options: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    # the model's transformers config (a size preset's, or the checkpoint's config.json): the
    # shapes a format's limits() may read (llama.cpp's k-quants need rows of a multiple of 256)
    arch: Mapping[str, Any] = field(default_factory=dict)

    def value(self, key: str) -> Any:
        """`model.kv_cache` -> the model's kv_cache; `phase.app` -> the phase's app."""
        group, _, name = key.partition(".")
        return getattr({"model": self.model, "phase": self.phase}[group], name)


@dataclass(frozen=True)
class Refusal:
    """One model choice it cannot handle: `key=value`, on `devices` (None: on every device)."""

    key: str  # model.kv_cache, model.attention, model.family, ...
    value: str
    why: str
    devices: tuple[str, ...] | None = None

    def reason(self, point: Point) -> str | None:
        if point.value(self.key) != self.value or (self.devices is not None and point.device not in self.devices):
            return None
        where = f" on device={point.device}" if self.devices is not None else ""
        return f"backend {point.backend} cannot run {self.key}={self.value}{where}: {self.why}"


@cache
def installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


class Part:
    """What a format and a runtime share: their facts, and what they refuse."""

    LIBRARIES: ClassVar[tuple[str, ...]] = ()
    REQUIRES: ClassVar[tuple[str, ...]] = ()
    MEMORY_FACTOR: ClassVar[float] = 1.5
    Options: ClassVar[type] = NoOptions
    PRELOAD: ClassVar[tuple[str, ...]] = ()
    DTYPES: ClassVar[Mapping[str, tuple[str, ...]]] = EVERY_DTYPE
    DTYPE_NOTE: ClassVar[str] = ""
    QUANTS: ClassVar[Mapping[str, tuple[str, ...]]] = NO_QUANT
    QUANT_NOTE: ClassVar[str | Mapping[str, str]] = ""
    REFUSALS: ClassVar[tuple[Refusal, ...]] = ()

    @property
    def name(self) -> str:
        """Its module's name (tasks.export.onnx, or an out-of-tree module's)."""
        return type(self).__module__

    def refuses(self, point: Point) -> str | None:
        """Why it cannot handle this point (planned as skipped, never a failure), or None."""
        for check in (self._missing, self._quant, self._refusal, self._dtype, self.limits):
            if why := check(point):
                return why
        return None

    def limits(self, point: Point) -> str | None:
        """Its own limits beyond the tables above (a combination of choices), or None."""
        return None

    def fixed_depth(self, point: Point) -> str | None:
        """Why one export (or one session) of this point measures a single cache depth, so that
        phase.depths is planned as one variant and export per depth; None (every format and runtime
        here): the graph takes the cache position, and the cache's length where it grows, as inputs."""
        return None

    def _missing(self, point: Point) -> str | None:
        missing = [d for d in self.REQUIRES if not installed(d)]
        if missing:
            return f"backend {point.backend} needs {', '.join(missing)}, not installed: pip install {' '.join(missing)}"
        return None

    def _quant(self, point: Point) -> str | None:
        quant, runs = point.model.quant, self.QUANTS.get(point.device, ("none",))
        if quant in runs:
            return None
        note = self.QUANT_NOTE
        note = (note.get(point.device, "") if isinstance(note, Mapping) else note) or f"{self.name} runs no quantised model (no QUANTS)"
        return f"backend {point.backend} cannot run model.quant={quant} on device={point.device} (runs: {', '.join(runs)}): {note}"

    def _refusal(self, point: Point) -> str | None:
        return next((why for r in self.REFUSALS if (why := r.reason(point))), None)

    def _dtype(self, point: Point) -> str | None:
        dtype, runs = point.model.dtype, self.DTYPES.get(point.device, ())
        if dtype in runs:
            return None
        note = f": {self.DTYPE_NOTE}" if self.DTYPE_NOTE else ""
        return (
            f"backend {point.backend} does not run model.dtype={dtype} on device={point.device} "
            f"(runs: {', '.join(runs) or 'none'}){note}"
        )


class ExportFormat(Part):
    """An export format: makes one artifact (or none) of a phase's graph.

    RESOURCES: the Ray resources one export asks for. MOVEMENT: its data-movement op names by
    kind (transposes, copies, casts) for the anatomy (tasks/export/_anatomy.py); {} without an
    artifact. name_tag(options): what variant names add after the backend's name ("genai").
    A format makes no quantised model unless its QUANTS says so (quantising in export() from
    description["model"], after the float reference was made).
    OWN_CACHE: its runtime keeps the KV cache itself, in place (llama.cpp's context), whatever
    model.kv_cache says: export() gets the transformers model (no phase graph), and the phase's
    data is made as for an in-graph cache (the context's tokens; no past inputs, no present outputs)."""

    RESOURCES: ClassVar[Mapping[str, Any]] = {"num_cpus": 1}
    MOVEMENT: ClassVar[Mapping[str, frozenset[str]]] = {}
    OWN_CACHE: ClassVar[bool] = False

    def name_tag(self, options: Mapping[str, Any]) -> str:
        return ""

    def export(
        self,
        graph: Any,
        args: tuple[Any, ...],
        input_names: list[str],
        output_names: list[str],
        out_dir: Path,
        options: dict[str, Any],
        description: dict[str, Any],
    ) -> tuple[str | None, dict[str, Any], dict[str, Any] | None]:
        """Write the artifact into `out_dir`, with `description` (tasks/export/_description.py)
        inside it: (artifact file name or None, details, anatomy or None)."""
        raise NotImplementedError


class Runtime(Part):
    """A runtime: loads a format's artifact (or the graph itself) and runs it as a Session.

    A runtime runs whatever quantised model the file holds unless its QUANTS says otherwise.
    PROFILER: the profiler its session's profile() uses (None: bench.profile=true is refused).
    MODELS: its load() builds transformers models, so its fork server also imports the modelling
    module of each family it runs (the export server always does)."""

    QUANTS: ClassVar[Mapping[str, tuple[str, ...]]] = EVERY_QUANT
    PROFILER: ClassVar[str | None] = None
    MODELS: ClassVar[bool] = False

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> Any:
        """A tasks.measure.session.Session on the export entry's artifact (meta["artifact"])."""
        raise NotImplementedError
