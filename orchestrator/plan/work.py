"""The plan's work: each named variant's benchmark (its spec, its Ray request, whether a node
can hold it) and the export jobs that fill the cache, one per export key."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from orchestrator.plan.config import ClusterCfg
from orchestrator.plan.placement import (
    Capacity,
    Request,
    bench_request,
    export_request,
    memory_warning,
    placement_error,
)
from orchestrator.plan.variant import Variant
from tasks.specs import BenchSpec, ExportSpec


@dataclass(frozen=True)
class PlannedVariant:
    """One variant, resolved: its benchmark's spec and resources are final when planned."""

    name: str
    variant: Variant  # bench.threads resolved against the cluster
    jobs: tuple[int, ...]  # Hydra job indices this variant answers
    bench: BenchSpec
    request: Request  # the benchmark's Ray options and pool
    unplaceable: str | None = None  # why no node can run it: it fails before any export
    warning: str | None = None
    configs: Sequence[DictConfig] = field(default=(), repr=False, compare=False)  # the sweep's

    @property
    def export_key(self) -> str:
        return self.variant.export_key

    @property
    def config(self) -> DictConfig:
        """Its first job's composed config (made when asked: orchestrator.plan.compose)."""
        return self.configs[self.jobs[0]]


@dataclass(frozen=True)
class ExportJob:
    spec: ExportSpec
    request: Request
    variants: tuple[str, ...]  # names of the variants it serves


def bench_spec(name: str, v: Variant, export_dir: str, rhythm_gap_ms: float | None = None) -> BenchSpec:
    """What a variant's benchmark task gets, reading its export from `export_dir`; a captured
    call's application's gap between forwards, `rhythm_gap_ms`, if its capture timed one."""
    return BenchSpec(
        variant=name,
        runtime=v.backend.runtime,
        device=v.device.name,
        model=v.model,
        phase=v.phase,
        export_dir=export_dir,
        bench=v.bench,
        runtime_options=dict(v.backend.options),
        peak_bandwidth_gbs=v.device.peak_bandwidth_gbs,
        env=v.env,
        rhythm_gap_ms=rhythm_gap_ms,
    )


def export_spec(v: Variant, out_dir: str) -> ExportSpec:
    """What a variant's export task gets, writing its entry at `out_dir`."""
    return ExportSpec(
        key=v.export_key,
        model=v.model,
        phase=v.phase,
        export_format=v.backend.export_format,
        out_dir=out_dir,
        options=dict(v.backend.export_options),
        quality=v.quality,
        env=v.env,
    )


def _export_dir(cache: Path, v: Variant) -> str:
    return os.path.join(cache, f"{v.model.name}_{v.phase.label}_{v.backend.export_format}-{v.export_key[:16]}")


def planned_work(
    named: Sequence[tuple[str, Variant, list[int], float | None]],
    configs: Sequence[DictConfig],
    capacity: Capacity,
    cluster: ClusterCfg,
) -> tuple[list[PlannedVariant], dict[str, ExportJob]]:
    """Each named variant (name, variant, its jobs, its captured call's gap) with its benchmark's
    spec and Ray request and whether a node can hold it at all; then one export job per export
    key, serving every variant that reads it."""
    cache = Path(cluster.export_cache).expanduser().resolve()
    planned, users = [], {}
    for name, v, jobs, gap_ms in named:
        spec = bench_spec(name, v, _export_dir(cache, v), gap_ms)
        runtime, fmt = v.backend.runtime_part, v.backend.format_part
        peak, weights, device = max(fmt.MEMORY_FACTOR, runtime.MEMORY_FACTOR), v.weight_bytes, v.device.name
        request = bench_request(
            capacity, device, v.bench.threads, v.device.resources, weights, runtime.MEMORY_FACTOR, cluster.max_retries
        )
        unplaceable = placement_error(capacity, device, weights)
        warning = memory_warning(capacity, weights, v.backend.export_format, peak)
        planned.append(PlannedVariant(name, v, tuple(jobs), spec, request, unplaceable, warning, configs))
        users.setdefault(v.export_key, []).append(name)
    exports: dict[str, ExportJob] = {}
    for pv in planned:
        v = pv.variant
        if v.export_key not in exports:
            fmt = v.backend.format_part
            request = export_request(capacity, fmt.RESOURCES, v.weight_bytes, fmt.MEMORY_FACTOR, cluster.max_retries)
            exports[v.export_key] = ExportJob(export_spec(v, pv.bench.export_dir), request, tuple(users[v.export_key]))
    return planned, exports
