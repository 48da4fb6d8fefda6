"""Grid -> valid variants (named, resolved) + skipped ones (with reasons) -> deduplicated
export jobs. The plan is final when made: nothing mutates it afterwards.

make_plan runs the stages in order, each over the whole grid and each in its own module: the
points' variants (here), the captured applications, run on the cluster (capture), what each
point measures (shapes), the grid's rules and what each backend can run (grid.sift), names
(naming), benchmarks and exports on the cluster (work), A/B pairs (pairs). No stage calls
another, or back into this module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from omegaconf import DictConfig

from orchestrator.plan.capture import Captures, Runner
from orchestrator.plan.config import SweepPoint
from orchestrator.plan.grid import Excluded, GridRules, Row, sift
from orchestrator.plan.naming import name_variants
from orchestrator.plan.pairs import pair_variants
from orchestrator.plan.placement import Capacity, bench_threads
from orchestrator.plan.shapes import shapes
from orchestrator.plan.support import Support
from orchestrator.plan.variant import Memo, Variant
from orchestrator.plan.work import ExportJob, PlannedVariant, planned_work
from tasks.specs import ExportSpec


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
class Plan:
    point: SweepPoint  # the first job's settings for the sweep-wide groups (tracking, cluster)
    capacity: Capacity
    variants: tuple[PlannedVariant, ...]
    skipped: tuple[Skipped, ...]
    exports: dict[str, ExportJob]  # export key -> the one job that fills it
    excluded: tuple[Excluded, ...] = ()  # by the grid's rules, in job order
    captures: Captures | None = None  # phase=captured: what each application's capture kept
    pairs: tuple[tuple[str, str], ...] = ()  # hydra.launcher.pair: (baseline, candidate) variant names
    store: Any = None  # where its runs are kept (orchestrator.record.store.Store), checked before it is made; None: a dry run

    def variant(self, name: str) -> PlannedVariant:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, PlannedVariant]:
        return {pv.name: pv for pv in self.variants}

    def fork_servers(self, to_make: Callable[[ExportSpec], bool] = lambda spec: True) -> dict[str, tuple[str, ...]]:
        """The fork servers each node runs for this plan, and what each imports: an export
        server for the exports `to_make` says are to be made (not in the cache); each imports the
        modelling modules of its own work's model families, not every family's."""
        from tasks.jobs import fork_servers  # lazy: tasks.jobs loads every task module; only a run asks this

        exports = {(job.spec.export_format, job.spec.model.family) for job in self.exports.values() if to_make(job.spec)}
        return fork_servers(exports, {(pv.bench.runtime, pv.bench.model.family) for pv in self.variants})


def _rows(
    points: list[SweepPoint], overrides: list[list[str]], capacity: Capacity, runner: Runner | None, memo: Memo
) -> tuple[list[Row], Captures | None]:
    """Each point's variants (a captured application's kept calls, once `runner` has run its
    capture; or one per depth where the backend fixes it), with bench.threads resolved against
    the cluster, params and keys seeded; and the captures run, if any."""
    bases = [Variant.from_point(point, tuple(overrides[idx]), memo) for idx, point in enumerate(points)]
    captures = Captures.of(points, bases, capacity) if runner is not None else None
    benches: dict[tuple[Any, str], Any] = {}  # (bench options, device) -> them, threads resolved
    for b in bases:  # bench.threads null: every core of a bench node
        if (b.bench, b.device.name) not in benches:
            benches[b.bench, b.device.name] = replace(b.bench, threads=bench_threads(capacity, b.device.name, b.bench.threads))
    if captures:  # phase=captured: each application first, on the cluster
        captures.run(runner)
    rows = []
    for idx, (point, base) in enumerate(zip(points, bases, strict=True)):
        for v in shapes(point, base, captures.kept(point) if captures else None):
            resolved = memo.seed(replace(v, bench=benches[(v.bench, v.device.name)]))
            rows.append(Row(idx, point, v, resolved, memo.identity(resolved)))
    return rows, captures or None


def make_plan(
    points: list[SweepPoint],
    configs: Sequence[DictConfig],
    overrides: list[list[str]],
    capacity: Capacity,
    rules: GridRules | None = None,
    store: Any = None,
    runner: Runner | None = None,
) -> Plan:
    """The whole grid, resolved against the cluster's capacity: named variants with their
    benchmark specs and resources, skipped combinations with reasons, deduplicated export
    jobs, and the points the grid's rules excluded. Raises ConfigError for a request no
    node can meet, before any run exists. Linear in the grid: what many points share (a
    model's spec, a phase, a bench setting, an export key, a backend's answer) is made once.
    `runner`: where a captured application runs first (phase=captured); without one (a dry
    run) nothing is captured, and a captured point stays one variant of the application."""
    rules = rules or GridRules()
    rows, captures = _rows(points, overrides, capacity, runner, Variant.memo())
    grid = sift(rows, rules, Support())
    to_run = [(v, jobs, captures.gaps.get(v.phase.inputs) if captures else None) for v, jobs in grid.kept]
    # skipped points are named with the others: a float32 variant and its skipped bfloat16
    # twin must not share a name (both are recorded)
    phases = {point.phase_part for point in points}
    names = name_variants([v for v, _, _ in to_run] + [row.resolved for row, _ in grid.skipped], overrides, phases)
    skipped = [
        Skipped(row.job, name, reason, row.v, configs)
        for name, (row, reason) in zip(names[len(to_run) :], grid.skipped, strict=True)
    ]
    named = [(name, v, jobs, gap) for name, (v, jobs, gap) in zip(names[: len(to_run)], to_run, strict=True)]
    planned, exports = planned_work(named, configs, capacity, points[0].cluster)
    pairs = pair_variants(planned, rules.pair) if rules.pair else ()
    return Plan(points[0], capacity, tuple(planned), tuple(skipped), exports, tuple(grid.excluded), captures, pairs, store)
