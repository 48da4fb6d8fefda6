"""Variant: the frozen description of one grid point, its params and its keys."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from functools import cache, cached_property, lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.plan.config import BackendCfg, DeviceCfg, SweepPoint
from tasks.export import format_module
from tasks.model.families import estimated_parameters
from tasks.phases import label
from tasks.runtimes import runtime_module
from tasks.specs import DTYPE_BYTES, GROUPED_QUANTS, BenchOptions, ModelSpec, PhaseSpec, QualitySpec

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"  # orchestrator/plan/variant.py -> the repository's tasks/


@cache
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


@lru_cache(maxsize=1)
def _tasks_source_hash() -> str:
    """Exports depend on our own graph code too: a change to tasks/ invalidates the cache."""
    h = hashlib.sha256()
    for path in sorted(TASKS_DIR.rglob("*.py")):
        h.update(path.relative_to(TASKS_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _checkpoint_identity(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    root = Path(path).expanduser().resolve()
    files = sorted(root.glob("*.safetensors")) + [root / "config.json"]
    return {
        "path": str(root),
        "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()],
    }


def quality_spec(bench: BenchOptions) -> QualitySpec | None:
    """What an export stores for the quality measurement; None with bench.quality=false."""
    if not bench.quality:
        return None
    text = str(Path(bench.quality_text).expanduser().resolve()) if bench.quality_text is not None else None
    return QualitySpec(tokens=bench.quality_tokens, text=text)


def _quality_identity(bench: BenchOptions) -> dict[str, Any] | None:
    if (q := quality_spec(bench)) is None:
        return None
    text = Path(q.text) if q.text else None
    return {"tokens": q.tokens, "text": text and (str(text), text.stat().st_size, text.stat().st_mtime_ns)}


def quant_tag(model: ModelSpec) -> str:
    """What a quantised variant's name ends with, swept or not: `_int4`, `_8da4w` or `_8da4wg64` when the
    group is not the default; "" for model.quant=none."""
    if model.quant == "none":
        return ""
    group = f"g{model.quant_group}" if model.quant_group != ModelSpec.quant_group else ""
    return f"_{model.quant}{group}"


@cache
def _name_tag(export_format: str) -> Any:
    """The format's `name_tag(export_options) -> str`: what it adds to the backend's name."""
    return format_module(export_format).name_tag


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists become their JSON text."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list | tuple):
        return {prefix[:-1]: json.dumps(obj)}
    return {prefix[:-1]: obj}


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, not copied (asdict deep-copies): flatten only reads them."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


PREFIXES = ("model.", "phase.", "backend.", "device.", "bench.")  # a variant's parts, as its params name them


def _parts(v: Variant) -> tuple[Any, ...]:
    return (v.model, v.phase, v.backend, v.device, v.bench)


class Memo:
    """What the variants of one plan share, made once per distinct part: each model group's
    spec and weight bytes, each part's flattened params, each export key, each identity.
    Points of one grid share their parts' objects (orchestrator.plan.config.validate_all: one
    object per distinct group content), so keys are object ids; the memo holds the objects,
    so an id is not reused while it lives. What it gives is what Variant computes itself."""

    def __init__(self) -> None:
        self.models: dict[int, tuple[Any, ModelSpec, int]] = {}
        self._flat: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._export_keys: dict[tuple[int, ...], tuple[tuple[Any, ...], str]] = {}
        self._digests: dict[int, tuple[Any, str]] = {}

    def _flatten(self, obj: Any, prefix: str) -> dict[str, Any]:
        if id(obj) not in self._flat:
            if prefix == "model.":
                model = _fields(obj)
                arch = model.pop("arch")
                flat = {**flatten(model, "model."), **flatten(arch, "model.arch.")}
            else:
                flat = flatten(_fields(obj), prefix)
            self._flat[id(obj)] = (obj, flat)
        return self._flat[id(obj)][1]

    def seed(self, v: Variant) -> Variant:
        """`v` with its params and export key filled in (cached_property's own slots)."""
        parts = _parts(v)
        params: dict[str, Any] = {}
        for part, prefix in zip(parts, PREFIXES, strict=True):
            params.update(self._flatten(part, prefix))
        v.__dict__["params"] = params
        key = (id(v.model), id(v.phase), id(v.backend), id(v.bench))  # bench: its quality settings
        if key in self._export_keys:
            v.__dict__["export_key"] = self._export_keys[key][1]
        else:
            self._export_keys[key] = ((*parts[:3], parts[4]), v.export_key)
        return v

    def identity(self, v: Variant) -> tuple[str, ...]:
        """What v.identity() tells apart, faster: each part's params digested once per part
        object; equal for two variants exactly when their params are."""
        return tuple(self._digest(p, prefix) for p, prefix in zip(_parts(v), PREFIXES, strict=True))

    def _digest(self, part: Any, prefix: str) -> str:
        if id(part) not in self._digests:
            self._digests[id(part)] = (part, _digest(self._flatten(part, prefix)))
        return self._digests[id(part)][1]


@dataclass(frozen=True)
class Variant:
    model: ModelSpec
    phase: PhaseSpec
    backend: BackendCfg
    device: DeviceCfg
    bench: BenchOptions
    overrides: tuple[str, ...] = ()
    weight_bytes: int = 0  # estimated from the architecture: memory requests, never the model

    @staticmethod
    def memo() -> Memo:
        return Memo()

    @classmethod
    def from_point(cls, point: SweepPoint, overrides: tuple[str, ...] = (), memo: Memo | None = None) -> Variant:
        m = point.model
        if memo is not None and id(m) in memo.models:
            _, model, weight_bytes = memo.models[id(m)]
            return cls(model, point.phase, point.backend, point.device, point.bench, tuple(overrides), weight_bytes)
        model = ModelSpec(
            name=m.name,
            family=m.family,
            size="checkpoint" if m.checkpoint else m.size,
            arch={} if m.checkpoint else dict(m.sizes[m.size]),
            checkpoint=str(Path(m.checkpoint).expanduser().resolve()) if m.checkpoint else None,
            dtype=m.dtype,
            seed=m.seed,
            kv_cache=m.kv_cache,
            attention=m.attention,
            quant=m.quant,
            # a group size only int4/8da4w use: the others keep the default, so it never tells two of them apart
            quant_group=m.quant_group if m.quant in GROUPED_QUANTS else ModelSpec.quant_group,
        )
        weight_bytes = (point.parameters or estimated_parameters(m.family, point.arch)) * DTYPE_BYTES[m.dtype]
        if memo is not None:
            memo.models[id(m)] = (m, model, weight_bytes)
        return cls(model, point.phase, point.backend, point.device, point.bench, tuple(overrides), weight_bytes)

    @property
    def base_name(self) -> str:
        backend = self.backend.name
        if text := _name_tag(self.backend.export_format)(self.backend.export_options):
            if not backend.endswith(f"_{text}"):  # backend=onnxruntime_genai says it already
                backend += f"_{text}"  # e.g. onnxruntime_genai: an export option that makes another artifact
        return f"{self.model.name}_{label(self.phase)}_{backend}_{self.device.name}{quant_tag(self.model)}"

    @cached_property
    def params(self) -> dict[str, Any]:
        """The flattened variant config, as MLflow params."""
        model = _fields(self.model)
        arch = model.pop("arch")
        return {
            **flatten(model, "model."),
            **flatten(arch, "model.arch."),
            **flatten(_fields(self.phase), "phase."),
            **flatten(_fields(self.backend), "backend."),
            **flatten(_fields(self.device), "device."),
            **flatten(_fields(self.bench), "bench."),
        }

    # the base name's four and the quantisation it ends with (quant_tag)
    BASE_NAME_KEYS = frozenset(
        {"model.name", "phase.name", "backend.name", "device.name", "model.quant", "model.quant_group"}
    )

    @staticmethod
    def naming_axis(key: str) -> bool:
        """A param that may earn a name suffix when it varies: all but the base name's four
        and those a size preset already implies."""
        return key not in Variant.BASE_NAME_KEYS and not key.startswith("model.arch.")

    def naming_axes(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if self.naming_axis(k)}

    @cached_property
    def export_key(self) -> str:
        """Hash of everything that changes the exported artifact, its inputs and reference."""
        fmt = self.backend.export_format
        model = asdict(self.model)
        model.pop("name")  # a preset's label does not change the graph
        model["checkpoint"] = _checkpoint_identity(self.model.checkpoint)
        return _digest(
            {
                "model": model,
                "phase": asdict(self.phase),
                "format": fmt,
                # the format's options only: eager and compile (format none) share one entry
                "options": self.backend.export_options,
                "quality": _quality_identity(self.bench),  # its inputs and reference are in the entry
                "versions": {lib: _version(lib) for lib in format_module(fmt).LIBRARIES},
                "tasks": _tasks_source_hash(),
            }
        )

    @cached_property
    def bench_key(self) -> str:
        """Export key + everything that changes the measurement."""
        return _digest(
            {
                "export": self.export_key,
                "runtime": self.backend.runtime,
                "options": self.backend.options,
                "device": asdict(self.device),
                "bench": asdict(self.bench),
                "versions": {lib: _version(lib) for lib in runtime_module(self.backend.runtime).LIBRARIES},
            }
        )

    def identity(self) -> str:
        """Equal for two grid points that would do exactly the same work."""
        return _digest(self.params)
