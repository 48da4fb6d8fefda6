"""Grid -> valid variants (named, resolved) + skipped ones (with reasons) -> deduplicated
export jobs. The plan is final when made: nothing mutates it afterwards."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from orchestrator.config import SweepPoint
from orchestrator.placement import (
    Capacity,
    Request,
    bench_request,
    bench_threads,
    export_request,
    memory_warning,
    placement_error,
)
from orchestrator.variant import Variant
from tasks.export import format_module
from tasks.runtimes import runtime_module
from tasks.specs import BenchSpec, ExportSpec

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


@dataclass(frozen=True)
class PlannedVariant:
    """One variant, resolved: its benchmark's spec and resources are final when planned."""

    name: str
    variant: Variant  # bench.threads resolved against the cluster
    config: DictConfig  # the composed config (without the hydra node)
    jobs: tuple[int, ...]  # Hydra job indices this variant answers
    bench: BenchSpec
    request: Request  # the benchmark's Ray options and pool
    unplaceable: str | None = None  # why no node can run it: it fails before any export
    warning: str | None = None

    @property
    def export_key(self) -> str:
        return self.variant.export_key


@dataclass(frozen=True)
class ExportJob:
    spec: ExportSpec
    request: Request
    variants: tuple[str, ...]  # names of the variants it serves


@dataclass(frozen=True)
class Skipped:
    job: int
    name: str
    reason: str
    variant: Variant
    config: DictConfig

    @property
    def key(self) -> str:
        """Unique among a sweep's outcomes: several jobs may skip the same combination."""
        return f"{self.name} (job #{self.job})"


@dataclass(frozen=True)
class Plan:
    point: SweepPoint  # the first job's settings for the sweep-wide groups (tracking, cluster)
    capacity: Capacity
    variants: tuple[PlannedVariant, ...]
    skipped: tuple[Skipped, ...]
    exports: dict[str, ExportJob]  # export key -> the one job that fills it

    def variant(self, name: str) -> PlannedVariant:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, PlannedVariant]:
        return {pv.name: pv for pv in self.variants}


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


def unsupported(point: SweepPoint) -> str | None:
    """Why this backend cannot run this point at all (a skip, never a failure), or None."""
    b, device, dtype = point.backend, point.device.name, point.model.dtype
    if device not in b.devices:
        return f"backend {b.name} does not run on device={device} (backend.devices: {', '.join(b.devices)})"
    runtime = runtime_module(b.runtime)
    runs = runtime.DTYPES.get(device, ())
    if dtype not in runs:
        note = getattr(runtime, "DTYPE_NOTE", "")
        return (
            f"backend {b.name} does not run model.dtype={dtype} on device={device} "
            f"(runs: {', '.join(runs) or 'none'}){': ' + note if note else ''}"
        )
    return None


def make_plan(
    points: list[SweepPoint], configs: list[DictConfig], overrides: list[list[str]], capacity: Capacity
) -> Plan:
    """The whole grid, resolved against the cluster's capacity: named variants with their
    benchmark specs and resources, skipped combinations with reasons, deduplicated export
    jobs. Raises ConfigError for a request no node can meet, before any run exists."""
    cluster = points[0].cluster
    valid: list[tuple[int, Variant, DictConfig]] = []
    skipped: list[Skipped] = []
    for idx, (point, cfg) in enumerate(zip(points, configs, strict=True)):
        v = Variant.from_point(point, tuple(overrides[idx]))
        reason = unsupported(point)
        if reason:
            skipped.append(Skipped(idx, v.base_name, reason, v, cfg))
            continue
        threads = bench_threads(capacity, v.device.name, v.bench.threads)  # "all cores" of a bench node
        valid.append((idx, replace(v, bench=replace(v.bench, threads=threads)), cfg))

    unique: dict[str, tuple[Variant, DictConfig, list[int]]] = {}
    for idx, v, cfg in valid:  # equal work is one variant, e.g. a decode-only axis swept over prefill
        unique.setdefault(v.identity(), (v, cfg, []))[2].append(idx)
    order = list(unique.values())
    names = _name_variants([v for v, _, _ in order], overrides)

    cache = Path(cluster.export_cache).expanduser().resolve()
    planned: list[PlannedVariant] = []
    users: dict[str, list[str]] = {}
    for name, (v, cfg, jobs) in zip(names, order, strict=True):
        runtime = runtime_module(v.backend.runtime)
        fmt = format_module(v.backend.export_format)
        request = bench_request(
            capacity,
            v.device.name,
            v.bench.threads,
            v.device.resources,
            v.weight_bytes,
            runtime.MEMORY_FACTOR,
            cluster.max_retries,
        )
        bench = BenchSpec(
            variant=name,
            runtime=v.backend.runtime,
            device=v.device.name,
            model=v.model,
            phase=v.phase,
            export_dir=_export_dir(cache, v),
            bench=v.bench,
            runtime_options=dict(v.backend.options),
            peak_bandwidth_gbs=v.device.peak_bandwidth_gbs,
        )
        peak = max(fmt.MEMORY_FACTOR, runtime.MEMORY_FACTOR)
        planned.append(
            PlannedVariant(
                name,
                v,
                cfg,
                tuple(jobs),
                bench,
                request,
                unplaceable=placement_error(capacity, v.device.name, v.weight_bytes),
                warning=memory_warning(capacity, v.weight_bytes, v.backend.export_format, peak),
            )
        )
        users.setdefault(v.export_key, []).append(name)

    exports: dict[str, ExportJob] = {}
    for pv in planned:
        v = pv.variant
        if v.export_key in exports:
            continue
        fmt = format_module(v.backend.export_format)
        spec = ExportSpec(
            key=v.export_key,
            model=v.model,
            phase=v.phase,
            export_format=v.backend.export_format,
            out_dir=pv.bench.export_dir,
            options=dict(v.backend.export_options),
        )
        request = export_request(capacity, fmt.RESOURCES, v.weight_bytes, fmt.MEMORY_FACTOR, cluster.max_retries)
        exports[v.export_key] = ExportJob(spec, request, tuple(users[v.export_key]))
    return Plan(points[0], capacity, tuple(planned), tuple(skipped), exports)
