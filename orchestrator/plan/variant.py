"""Variant: the frozen description of one grid point, its params and its keys."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import cache, cached_property, lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.plan.config import BackendCfg, DeviceCfg, SweepPoint
from tasks.specs import DTYPE_BYTES, GROUPED_QUANTS, BenchOptions, EnvSpec, ModelSpec, PhaseSpec, QualitySpec

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


def _checkpoint_identity(path: str | None, revision: str | None) -> dict[str, Any] | None:
    """A folder by its files' names, sizes and times; a Hugging Face id by its id (its commit,
    model.revision, is in the model's identity too: a new commit is a new export)."""
    if not path:
        return None
    if revision:
        return {"hub": path, "revision": revision}
    root = Path(path).expanduser().resolve()
    files = sorted(root.glob("*.safetensors")) + [root / "config.json"]
    return {
        "path": str(root),
        "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()],
    }


def _checkpoint(path: str | None, revision: str | None) -> str | None:
    """A folder as its absolute path; a Hugging Face id (it has a commit) as it is."""
    if not path or revision:
        return path or None
    return str(Path(path).expanduser().resolve())


def quality_spec(bench: BenchOptions) -> QualitySpec | None:
    """What an export stores for the quality measurement; None with bench.quality=false."""
    if not bench.quality:
        return None
    text = str(Path(bench.quality_text).expanduser().resolve()) if bench.quality_text is not None else None
    return QualitySpec(tokens=bench.quality_tokens, text=text)


def _quality_identity(q: QualitySpec | None) -> dict[str, Any] | None:
    """What of a quality spec changes an export: its tokens, its text file by its size and time."""
    if q is None:
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


def _model_identity(model: ModelSpec) -> dict[str, Any]:
    """What of the model changes an export: all but a preset's label, a checkpoint by its files."""
    identity = asdict(model)
    identity.pop("name")
    identity["checkpoint"] = _checkpoint_identity(model.checkpoint, model.revision)
    return identity


def _export_texts(backend: BackendCfg) -> dict[str, str]:
    """The parts of an export key a backend decides, each as its JSON text (_json)."""
    fmt = backend.export_format
    return {
        "format": _json(fmt),
        # the format's options only: eager and compile (format none) share one entry
        "options": _json(backend.export_options),
        "versions": _json({lib: _version(lib) for lib in backend.format_part.LIBRARIES}),
        "tasks": _json(_tasks_source_hash()),
    }


def _export_key(model: str, phase: str, backend: dict[str, str], quality: str, env: EnvSpec) -> str:
    """Variant.export_key from its parts' JSON texts: the model's _model_identity, the phase's
    fields, the backend's _export_texts, the bench's _quality_identity (its inputs and
    reference are in the entry), and env.pip's pins when set (the driver's versions are in
    _export_texts; an export made with other libraries is another entry)."""
    pins = {"env": _json(list(env.pip))} if env.pip else {}
    return _digest_texts({**backend, "model": model, "phase": phase, "quality": quality, **pins})


def _json(obj: Any) -> str:
    if type(obj) is str:  # a key of the export key's dict, or a format's name: its text made once
        return _json_str(obj)
    return json.dumps(obj, sort_keys=True, default=str)


@cache
def _json_str(text: str) -> str:
    return json.dumps(text)


def _digest_texts(texts: dict[str, str]) -> str:
    """_digest of a dict given as its values' JSON texts: the text json.dumps writes of the
    dict itself, made without encoding the values again (tests/test_plan.py)."""
    body = ", ".join(f"{_json(key)}: {texts[key]}" for key in sorted(texts))
    return hashlib.sha256(f"{{{body}}}".encode()).hexdigest()


def _digest(obj: Any) -> str:
    return hashlib.sha256(_json(obj).encode()).hexdigest()


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


PREFIXES = ("model.", "phase.", "backend.", "device.", "bench.", "env.")  # a variant's parts, as its params name them


def _parts(v: Variant) -> tuple[Any, ...]:
    return (v.model, v.phase, v.backend, v.device, v.bench, v.env)


def _env_params(env: EnvSpec) -> dict[str, Any]:
    """env.pip as a param (its pins' JSON list) when set; the driver's own environment adds none."""
    return flatten(_fields(env), "env.") if env.pip else {}


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
        self._texts: dict[int, tuple[Any, Any]] = {}  # part id -> (the part, what its export key reads of it)
        self._envs: dict[int, tuple[Any, EnvSpec]] = {}  # env group id -> (the group, its spec)

    def _flatten(self, obj: Any, prefix: str) -> dict[str, Any]:
        if id(obj) not in self._flat:
            if prefix == "model.":
                model = _fields(obj)
                arch = model.pop("arch")
                flat = {**flatten(model, "model."), **flatten(arch, "model.arch.")}
            elif prefix == "env.":
                flat = _env_params(obj)
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
        key = (id(v.model), id(v.phase), id(v.backend), id(v.bench), id(v.env))  # bench: its quality settings
        if key not in self._export_keys:
            texts = (
                self._text(v.model, lambda m: _json(_model_identity(m))),
                self._text(v.phase, lambda p: _json(asdict(p))),
                self._text(v.backend, _export_texts),
                self._text(v.bench, lambda b: _json(_quality_identity(quality_spec(b)))),
            )
            self._export_keys[key] = ((*parts[:3], *parts[4:]), _export_key(*texts, v.env))
        v.__dict__["export_key"] = self._export_keys[key][1]
        return v

    def env(self, cfg: Any) -> EnvSpec:
        """The point's env group as its spec, one object per distinct group object."""
        if id(cfg) not in self._envs:
            self._envs[id(cfg)] = (cfg, cfg.spec())
        return self._envs[id(cfg)][1]

    def _text(self, part: Any, make: Callable[[Any], Any]) -> Any:
        """What `make` gives for `part`, made once per part object."""
        if id(part) not in self._texts:
            self._texts[id(part)] = (part, make(part))
        return self._texts[id(part)][1]

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
    env: EnvSpec = EnvSpec()  # env.pip: the libraries it runs with instead of the driver's

    @staticmethod
    def memo() -> Memo:
        return Memo()

    @classmethod
    def from_point(cls, point: SweepPoint, overrides: tuple[str, ...] = (), memo: Memo | None = None) -> Variant:
        m = point.model
        env = memo.env(point.env) if memo is not None else point.env.spec()
        if memo is not None and id(m) in memo.models:
            _, model, weight_bytes = memo.models[id(m)]
            return cls(model, point.phase, point.backend, point.device, point.bench, tuple(overrides), weight_bytes, env)
        model = ModelSpec(
            name=m.name,
            family=m.family,
            size="checkpoint" if m.checkpoint else m.size,
            arch={} if m.checkpoint else dict(m.sizes[m.size]),
            checkpoint=_checkpoint(m.checkpoint, m.revision),
            revision=m.revision,  # a Hub id's commit, as the driver resolved it (tasks.model.hub)
            dtype=m.dtype,
            seed=m.seed,
            kv_cache=m.kv_cache,
            attention=m.attention,
            quant=m.quant,
            # a group size only int4/8da4w use: the others keep the default, so it never tells two of them apart
            quant_group=m.quant_group if m.quant in GROUPED_QUANTS else ModelSpec.quant_group,
        )
        weight_bytes = point.parameters * DTYPE_BYTES[m.dtype]
        if memo is not None:
            memo.models[id(m)] = (m, model, weight_bytes)
        return cls(model, point.phase, point.backend, point.device, point.bench, tuple(overrides), weight_bytes, env)

    @property
    def base_name(self) -> str:
        backend = self.backend.name
        if text := self.backend.format_part.name_tag(self.backend.export_options):  # what the format adds to the name
            if not backend.endswith(f"_{text}"):  # backend=onnxruntime_genai says it already
                backend += f"_{text}"  # e.g. onnxruntime_genai: an export option that makes another artifact
        return f"{self.model.name}_{self.phase.label}_{backend}_{self.device.name}{quant_tag(self.model)}{self.env.tag}"

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
            **_env_params(self.env),
        }

    # the base name's four, the quantisation it ends with (quant_tag) and its env.pip pins (EnvSpec.tag)
    BASE_NAME_KEYS = frozenset(
        {"model.name", "phase.name", "backend.name", "device.name", "model.quant", "model.quant_group", "env.pip"}
    )

    @staticmethod
    def naming_axis(key: str) -> bool:
        """A param that may earn a name suffix when it varies: all but the base name's four
        and those a size preset already implies."""
        return key not in Variant.BASE_NAME_KEYS and not key.startswith("model.arch.")

    def naming_axes(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if self.naming_axis(k)}

    @cached_property
    def quality(self) -> QualitySpec | None:
        """What its export stores for the quality measurement (in its export key too)."""
        return quality_spec(self.bench)

    @cached_property
    def export_key(self) -> str:
        """Hash of everything that changes the exported artifact, its inputs and reference."""
        return _export_key(
            _json(_model_identity(self.model)),
            _json(asdict(self.phase)),
            _export_texts(self.backend),
            _json(_quality_identity(self.quality)),
            self.env,
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
                "versions": {lib: _version(lib) for lib in self.backend.runtime_part.LIBRARIES},
                **({"env": list(self.env.pip)} if self.env.pip else {}),  # the driver's versions above are not the env's
            }
        )

    def identity(self) -> str:
        """Equal for two grid points that would do exactly the same work."""
        return _digest(self.params)
