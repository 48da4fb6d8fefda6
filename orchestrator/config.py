"""Config schemas, validated in the driver before any work starts.

Each config group is merged onto a dataclass schema (types, unknown keys), then checked
for allowed values. Every error names the key, the value and what is allowed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from tasks.specs import (
    ATTENTIONS,
    DEVICES,
    DTYPES,
    EXPORT_FORMATS,
    FAMILIES,
    KV_CACHES,
    PHASES,
    BenchOptions,
    PhaseSpec,
)


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key, the value and the choices."""


def choice(key: str, value: Any, allowed: Any) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def at_least(key: str, value: Any, low: float, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or value < low:
        raise ConfigError(f"{key}={value!r} must be >= {low:g}" + (" (or null)" if optional else ""))


@dataclass
class ModelCfg:
    name: str
    family: str
    size: str
    sizes: dict[str, Any]
    checkpoint: str | None = None
    dtype: str = "float32"
    seed: int = 0
    kv_cache: str = "static"
    attention: str = "sdpa"

    def check(self) -> None:
        choice("model.family", self.family, FAMILIES)
        choice("model.size", self.size, self.sizes)
        choice("model.dtype", self.dtype, DTYPES)
        choice("model.kv_cache", self.kv_cache, KV_CACHES)
        choice("model.attention", self.attention, ATTENTIONS)


@dataclass
class BackendCfg:
    name: str
    export_format: str
    devices: list[str]
    options: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        choice("backend.export_format", self.export_format, EXPORT_FORMATS)
        for d in self.devices:
            choice("backend.devices[]", d, DEVICES)
        if importlib.util.find_spec(f"tasks.runtimes.{self.name}") is None:
            raise ConfigError(f"backend.name={self.name!r} has no runtime module tasks/runtimes/{self.name}.py")


@dataclass
class DeviceCfg:
    name: str
    resources: dict[str, Any] = field(default_factory=dict)
    peak_bandwidth_gbs: float | None = None

    def check(self) -> None:
        choice("device.name", self.name, DEVICES)


@dataclass
class TrackingCfg:
    uri: str | None = None
    artifact_root: str | None = None
    experiment: str = "phasesweep"
    max_model_mb: float | None = None  # larger exported models are not copied into MLflow

    def check(self) -> None:
        at_least("tracking.max_model_mb", self.max_model_mb, 0, optional=True)


@dataclass
class ClusterCfg:
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = False
    export_cache: str = ".phasesweep_cache"
    task_timeout_s: float = 3600.0
    max_retries: int = 1

    def check(self) -> None:
        at_least("cluster.num_cpus", self.num_cpus, 1, optional=True)
        at_least("cluster.task_timeout_s", self.task_timeout_s, 1)
        at_least("cluster.max_retries", self.max_retries, 0)


def check_phase(p: PhaseSpec) -> None:
    choice("phase.name", p.name, PHASES)
    at_least("phase.batch", p.batch, 1)
    if p.name == "prefill":
        at_least("phase.prompt_len", p.prompt_len, 1)
    else:
        at_least("phase.context_len", p.context_len, 1)
        at_least("phase.parity_steps", p.parity_steps, 1)
        at_least("phase.cache_len", p.cache_len, 1, optional=True)


def check_bench(b: BenchOptions) -> None:
    for key in ("warmup_iters", "min_iters", "max_iters"):
        at_least(f"bench.{key}", getattr(b, key), 1)
    for key in ("warmup_max_seconds", "min_seconds", "max_seconds", "cv_threshold", "parity_atol"):
        at_least(f"bench.{key}", getattr(b, key), 0)
    at_least("bench.threads", b.threads, 1, optional=True)
    if b.min_iters > b.max_iters:
        raise ConfigError(f"bench.min_iters={b.min_iters} exceeds bench.max_iters={b.max_iters}")


@dataclass
class SweepPoint:
    """One composed config, validated: what a single grid point asks for."""

    model: ModelCfg
    phase: PhaseSpec
    backend: BackendCfg
    device: DeviceCfg
    bench: BenchOptions
    tracking: TrackingCfg
    cluster: ClusterCfg


_SCHEMAS = {
    "model": ModelCfg,
    "phase": PhaseSpec,
    "backend": BackendCfg,
    "device": DeviceCfg,
    "bench": BenchOptions,
    "tracking": TrackingCfg,
    "cluster": ClusterCfg,
}


def _section(cfg: DictConfig, key: str) -> Any:
    schema = _SCHEMAS[key]
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config group '{key}' is missing; choose one from conf/{key}/")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg[key])
        return OmegaConf.to_object(merged)
    except ConfigKeyError as e:
        allowed = ", ".join(f.name for f in fields(schema))
        raise ConfigError(f"{key}.{e.key} is not a known key; allowed keys: {allowed}") from None
    except OmegaConfBaseException as e:
        value = OmegaConf.select(cfg, f"{key}.{e.key}", default=None) if e.key else None
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{key}.{e.key}={value!r}: {msg}") from None


def validate(cfg: DictConfig) -> SweepPoint:
    """The composed config as checked dataclasses, or a ConfigError."""
    unknown = [k for k in cfg if k not in _SCHEMAS and k != "hydra"]
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(_SCHEMAS)}")
    point = SweepPoint(**{key: _section(cfg, key) for key in _SCHEMAS})
    point.model.check()
    check_phase(point.phase)
    point.backend.check()
    point.device.check()
    check_bench(point.bench)
    point.cluster.check()
    point.tracking.check()
    return point
