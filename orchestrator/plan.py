"""Grid -> valid variants (named) + skipped ones (with reasons) -> deduplicated export jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from orchestrator.config import ConfigError, SweepPoint, validate
from orchestrator.variant import Variant
from tasks.specs import ExportSpec

# how a varying axis reads in a variant name; others read `{leaf}{value}`
SHORT = {
    "phase.context_len": "ctx",
    "phase.prompt_len": "p",
    "phase.batch": "b",
    "phase.cache_len": "cache",
    "model.kv_cache": "kv",
    "model.attention": "",
    "model.size": "",
}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def suffix(key: str, value: Any) -> str:
    if key == "model.dtype":
        return DTYPE_SHORT.get(value, str(value))
    if key == "model.checkpoint":
        return f"ckpt-{Path(value).name}" if value else "random"
    prefix = SHORT.get(key, key.rsplit(".", 1)[-1])
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"{prefix}{text}".replace("/", "-").replace(" ", "")


@dataclass
class PlannedVariant:
    name: str
    variant: Variant
    config: DictConfig  # the composed config (without the hydra node)
    jobs: list[int] = field(default_factory=list)  # Hydra job indices this variant answers
    resources: tuple[dict[str, Any], str] | None = None  # Ray options + capacity pool, from Scheduler.bench_options

    @property
    def export_key(self) -> str:
        return self.variant.export_key


@dataclass
class Skipped:
    job: int
    name: str
    reason: str
    variant: Variant
    config: DictConfig


@dataclass
class Plan:
    point: SweepPoint  # the first job's settings for the sweep-wide groups (tracking, cluster)
    variants: list[PlannedVariant]
    skipped: list[Skipped]
    exports: dict[str, ExportSpec]  # export key -> the one job that fills it

    def by_export(self, key: str) -> list[PlannedVariant]:
        return [pv for pv in self.variants if pv.export_key == key]


def _swept_keys(overrides: list[list[str]]) -> set[str]:
    """Config keys the user set on the command line (`phase.context_len=128,512` -> phase.context_len)."""
    keys = set()
    for job in overrides:
        for o in job:
            key = o.split("=", 1)[0].lstrip("+~")
            if not key.startswith("hydra"):
                keys.add(key)
    return keys


def _name_variants(variants: list[Variant], overrides: list[list[str]]) -> list[str]:
    """`{model}_{phase}_{backend}_{device}` + a suffix for each axis the user swept that
    varies among the variants sharing that base name (e.g. `_ctx2048`). Values that follow
    from another choice (a preset's family, a derived cache size) never add a suffix."""
    # choosing a model/phase/backend/device option is already in the base name; other
    # group choices (bench=quick) make every key of that group eligible
    swept = _swept_keys(overrides) - {"model", "phase", "backend", "device"}

    def eligible(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in swept for i in range(1, len(parts) + 1))

    axes = [v.naming_axes() for v in variants]
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(variants):
        groups.setdefault(v.base_name, []).append(i)
    names = [v.base_name for v in variants]
    for members in groups.values():
        keys = sorted({k for i in members for k in axes[i] if eligible(k)})
        varying = [k for k in keys if len({repr(axes[i].get(k)) for i in members}) > 1]
        for i in members:
            parts = [suffix(k, axes[i][k]) for k in varying if axes[i].get(k) is not None]
            names[i] = "_".join([names[i], *parts])
    return names


def _export_dir(cache: Path, v: Variant) -> str:
    return str(cache / f"{v.model.name}_{v.phase.name}_{v.backend.export_format}-{v.export_key[:16]}")


def make_plan(configs: list[DictConfig], overrides: list[list[str]]) -> Plan:
    """Validate every job's config (all errors at once), then plan the whole grid."""
    points, errors = [], []
    for idx, cfg in enumerate(configs):
        try:
            points.append(validate(cfg))
        except ConfigError as e:
            where = f"job #{idx} ({' '.join(overrides[idx])}): " if len(configs) > 1 else ""
            errors.append(f"{where}{e}")
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    for group in ("tracking", "cluster"):  # one sweep is one MLflow parent run on one Ray
        values = {repr(getattr(p, group)) for p in points}
        if len(values) > 1:
            raise ConfigError(
                f"{group}.* must be the same for every job of a sweep; got {len(values)} different "
                f"settings (sweep {group} options in separate invocations)"
            )

    valid: list[tuple[int, Variant, DictConfig]] = []
    skipped: list[Skipped] = []
    for idx, (point, cfg) in enumerate(zip(points, configs, strict=True)):
        v = Variant.from_point(point, tuple(overrides[idx]))
        if point.device.name not in point.backend.devices:
            reason = (
                f"backend {point.backend.name} does not run on device={point.device.name} "
                f"(backend.devices: {', '.join(point.backend.devices)})"
            )
            skipped.append(Skipped(idx, v.base_name, reason, v, cfg))
            continue
        valid.append((idx, v, cfg))

    unique: dict[str, PlannedVariant] = {}
    order: list[PlannedVariant] = []
    for idx, v, cfg in valid:
        ident = v.identity()
        if ident in unique:  # e.g. a decode-only axis swept over a prefill variant
            unique[ident].jobs.append(idx)
            continue
        pv = PlannedVariant("", v, cfg, [idx])
        unique[ident] = pv
        order.append(pv)
    for pv, name in zip(order, _name_variants([pv.variant for pv in order], overrides), strict=True):
        pv.name = name

    cache = Path(points[0].cluster.export_cache).expanduser().resolve()
    exports: dict[str, ExportSpec] = {}
    for pv in order:
        v = pv.variant
        if v.export_key not in exports:
            exports[v.export_key] = ExportSpec(
                key=v.export_key,
                model=v.model,
                phase=v.phase,
                export_format=v.backend.export_format,
                out_dir=_export_dir(cache, v),
                options=dict(v.backend.options),
            )
    return Plan(points[0], order, skipped, exports)
