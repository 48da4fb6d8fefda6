"""Grid -> valid variants (named, resolved) + skipped ones (with reasons) -> deduplicated
export jobs. The plan is final when made: nothing mutates it afterwards."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from orchestrator.plan.capture import Captures
from orchestrator.plan.config import SweepPoint
from orchestrator.plan.depths import per_depth
from orchestrator.plan.grid import GridRules
from orchestrator.plan.naming import name_variants
from orchestrator.plan.pairs import pair_variants
from orchestrator.plan.placement import (
    Capacity,
    Request,
    bench_request,
    bench_threads,
    export_request,
    memory_warning,
    placement_error,
)
from orchestrator.plan.support import Support
from orchestrator.plan.variant import Memo, Variant, quality_spec
from tasks.export import format_module
from tasks.phases import label
from tasks.runtimes import runtime_module
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


@dataclass(frozen=True)
class Skipped:
    job: int
    name: str
    reason: str
    variant: Variant
    configs: Sequence[DictConfig] = field(default=(), repr=False, compare=False)  # the sweep's

    @property
    def key(self) -> str:
        """Unique among a sweep's outcomes: several jobs may skip the same combination."""
        return f"{self.name} (job #{self.job})"

    @property
    def config(self) -> DictConfig:
        return self.configs[self.job]


@dataclass(frozen=True)
class Excluded:
    """Points the grid's rules (orchestrator/plan/grid.py) left out: nothing runs or is recorded."""

    jobs: tuple[int, ...]
    name: str  # its base name
    rule: str  # the rule that excluded it, as the plan prints it

    @property
    def key(self) -> str:
        more = f" +{len(self.jobs) - 1}" if len(self.jobs) > 1 else ""
        return f"{self.name} (job #{self.jobs[0]}{more})"


@dataclass(frozen=True)
class Plan:
    point: SweepPoint  # the first job's settings for the sweep-wide groups (tracking, cluster)
    capacity: Capacity
    variants: tuple[PlannedVariant, ...]
    skipped: tuple[Skipped, ...]
    exports: dict[str, ExportJob]  # export key -> the one job that fills it
    excluded: tuple[Excluded, ...] = ()  # by the grid's rules, in job order
    captures: Captures | None = None  # phase=captured: what each application's capture kept
    pairs: tuple[tuple[str, str], ...] = ()  # hydra.launcher.pair: (baseline, candidate) variant names

    def variant(self, name: str) -> PlannedVariant:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, PlannedVariant]:
        return {pv.name: pv for pv in self.variants}

    def fork_servers(self, to_make: Callable[[ExportSpec], bool] = lambda spec: True) -> dict[str, tuple[str, ...]]:
        """The fork servers each node runs for this plan, and what each imports: an export
        server for the formats of the exports `to_make` says are to be made (not in the cache)."""
        from tasks.jobs import fork_servers  # lazy: tasks.jobs loads every task module; only a run asks this

        formats = {job.spec.export_format for job in self.exports.values() if to_make(job.spec)}
        return fork_servers(formats, {pv.bench.runtime for pv in self.variants})


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
        quality=quality_spec(v.bench),
        env=v.env,
    )


def _export_dir(cache: Path, v: Variant) -> str:
    return os.path.join(cache, f"{v.model.name}_{label(v.phase)}_{v.backend.export_format}-{v.export_key[:16]}")


@dataclass
class _Grid:
    """The grid's points as planning sorts them: to run (job, variant), skipped (job, variant,
    variant with threads resolved, reason), and excluded by the grid's rules."""

    valid: list[tuple[int, Variant]] = field(default_factory=list)
    skipped: list[tuple[int, Variant, Variant, str]] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)


def _sort_points(
    points: list[SweepPoint],
    overrides: list[list[str]],
    capacity: Capacity,
    rules: GridRules,
    captures: Captures | None,
    memo: Memo,
) -> _Grid:
    """Each point's variants (a captured application's kept shapes), with bench.threads
    resolved against the cluster, sorted into to run, skipped and excluded by the rules."""
    grid, support = _Grid(), Support()
    threads: dict[tuple[Any, str], Any] = {}  # (bench options, device) -> them, threads resolved
    for idx, point in enumerate(points):
        base = Variant.from_point(point, tuple(overrides[idx]), memo)
        kept = captures.phases(point) if captures else None
        variants = per_depth(point, base) if kept is None else [replace(base, phase=phase) for phase in kept]
        for v in variants:
            key = (v.bench, v.device.name)
            if key not in threads:  # bench.threads null: every core of a bench node
                threads[key] = replace(v.bench, threads=bench_threads(capacity, v.device.name, v.bench.threads))
            resolved = memo.seed(replace(v, bench=threads[key]))
            rule = rules.why_excluded(resolved.params) if rules.active else None
            if rule:
                grid.excluded.append(Excluded((idx,), v.base_name, rule))
            elif reason := support(point):
                grid.skipped.append((idx, v, resolved, reason))
            else:
                grid.valid.append((idx, resolved))
    return grid


def _unique(grid: _Grid, rules: GridRules, memo: Memo) -> list[tuple[Variant, list[int]]]:
    """Equal work is one variant (e.g. a decode-only axis swept over prefill), answering all its
    jobs; with rules.max_variants, the first N of each model in grid order (the rest excluded)."""
    unique: dict[tuple[str, ...], tuple[Variant, list[int]]] = {}
    for idx, v in grid.valid:
        unique.setdefault(memo.identity(v), (v, []))[1].append(idx)
    order = list(unique.values())
    if rules.max_variants is None:
        return order
    kept, per_model = [], Counter()
    for v, jobs in order:
        per_model[v.model.name] += 1
        if per_model[v.model.name] <= rules.max_variants:
            kept.append((v, jobs))
        else:
            grid.excluded.append(Excluded(tuple(jobs), v.base_name, rules.cap_text(v.model.name)))
    grid.excluded.sort(key=lambda e: e.jobs[0])
    return kept


def _distinct_skipped(grid: _Grid, memo: Memo) -> list[tuple[int, Variant, Variant, str]]:
    """Equal skipped work is one skipped variant, as for those that run."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for skip in grid.skipped:
        if (identity := memo.identity(skip[2])) not in seen:
            seen.add(identity)
            out.append(skip)
    return out


def _planned_variant(
    name: str, v: Variant, jobs: list[int], configs: Sequence[DictConfig], capacity: Capacity, point: SweepPoint,
    gap_ms: float | None = None,
) -> PlannedVariant:
    """A variant's benchmark spec and Ray request, and whether a node can hold it at all."""
    runtime, fmt = runtime_module(v.backend.runtime), format_module(v.backend.export_format)
    cluster = point.cluster
    request = bench_request(
        capacity, v.device.name, v.bench.threads, v.device.resources, v.weight_bytes, runtime.MEMORY_FACTOR, cluster.max_retries
    )
    cache = Path(cluster.export_cache).expanduser().resolve()
    peak = max(fmt.MEMORY_FACTOR, runtime.MEMORY_FACTOR)
    return PlannedVariant(
        name,
        v,
        tuple(jobs),
        bench_spec(name, v, _export_dir(cache, v), gap_ms),
        request,
        unplaceable=placement_error(capacity, v.device.name, v.weight_bytes),
        warning=memory_warning(capacity, v.weight_bytes, v.backend.export_format, peak),
        configs=configs,
    )


def _exports(planned: list[PlannedVariant], capacity: Capacity, max_retries: int) -> dict[str, ExportJob]:
    """One export job per export key, serving every variant that reads it."""
    users: dict[str, list[str]] = {}
    for pv in planned:
        users.setdefault(pv.export_key, []).append(pv.name)
    exports: dict[str, ExportJob] = {}
    for pv in planned:
        v = pv.variant
        if v.export_key not in exports:
            fmt = format_module(v.backend.export_format)
            request = export_request(capacity, fmt.RESOURCES, v.weight_bytes, fmt.MEMORY_FACTOR, max_retries)
            exports[v.export_key] = ExportJob(export_spec(v, pv.bench.export_dir), request, tuple(users[v.export_key]))
    return exports


def make_plan(
    points: list[SweepPoint],
    configs: Sequence[DictConfig],
    overrides: list[list[str]],
    capacity: Capacity,
    rules: GridRules | None = None,
    captures: Captures | None = None,
) -> Plan:
    """The whole grid, resolved against the cluster's capacity: named variants with their
    benchmark specs and resources, skipped combinations with reasons, deduplicated export
    jobs, and the points the grid's rules excluded. Raises ConfigError for a request no
    node can meet, before any run exists. Linear in the grid: what many points share (a
    model's spec, a phase, a bench setting, an export key, a backend's answer) is made once."""
    rules = rules or GridRules()
    memo = Variant.memo()
    grid = _sort_points(points, overrides, capacity, rules, captures, memo)
    order = _unique(grid, rules, memo)
    unnamed = _distinct_skipped(grid, memo)
    # skipped points are named with the others: a float32 variant and its skipped bfloat16
    # twin must not share a name (both are recorded)
    names = name_variants([v for v, _ in order] + [r for _, _, r, _ in unnamed], overrides)
    skipped = [
        Skipped(idx, name, reason, v, configs)
        for name, (idx, v, _, reason) in zip(names[len(order) :], unnamed, strict=True)
    ]
    planned = [
        _planned_variant(name, v, jobs, configs, capacity, points[0], captures.gap_ms(v.phase) if captures else None)
        for name, (v, jobs) in zip(names[: len(order)], order, strict=True)
    ]
    exports = _exports(planned, capacity, points[0].cluster.max_retries)
    pairs = pair_variants(planned, rules.pair) if rules.pair else ()
    return Plan(points[0], capacity, tuple(planned), tuple(skipped), exports, tuple(grid.excluded), captures, pairs)
