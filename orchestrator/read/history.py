"""Each variant across the sweeps of an experiment: its median and interval per sweep, in time
or commit order, kept apart by the machine it ran on, and the sweeps where it changed.

A change is the regression verdict's (orchestrator/read/stats.py `compare_sweeps`: the ratio's
block-bootstrap interval, Holm-corrected across the variants two sweeps share, the
machine-speed probe's disturbance rule), between a sweep and the one before it in the series.
Read from MLflow alone: nothing is kept beside it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.read.draw import CI_HIGH, CI_LOW, MEDIAN
from orchestrator.read.stats import compare_sweeps, disturbances
from orchestrator.read.store import SWEEP_FILTER, UsageError
from orchestrator.read.verdict_table import ok_runs, sweep_samples
from orchestrator.record.revision import short
from orchestrator.record.tracking import search_all

# the machine fingerprint each variant's run records (tasks/measure/environment.py, env.* tags):
# runs whose fingerprints differ are never compared
MACHINE = ("env.host", "env.cpu_model", "env.cpus_usable", "env.gpu_name", "env.gpu_count")
ORDERS = ("time", "commit")


def machine_of(run: Any) -> str:
    """The machine a variant's run measured on, as one line (`host · cpu · 2 cpus · gpu`)."""
    tags = run.data.tags
    host, cpu, cpus, gpu, gpus = (tags.get(k, "") for k in MACHINE)
    return " · ".join(p for p in (host, cpu, f"{cpus} cpus" if cpus else "", f"{gpus}x {gpu}" if gpu else "") if p)


@dataclass
class Point:
    """One variant's figures in one sweep."""

    variant: str
    machine: str
    sweep: Any  # the sweep run
    run: Any  # the variant's run
    change: str | None = None  # slower / faster than the point before it in its series
    against: str | None = None  # that point's sweep name
    ratio: tuple[float, float, float] | None = None  # (ratio, low, high) against it
    judged: dict[str, Any] = field(default_factory=dict)  # the verdict's whole row

    @property
    def median(self) -> float:
        return self.run.data.metrics[MEDIAN]

    @property
    def interval(self) -> tuple[float, float]:
        m = self.run.data.metrics
        return m.get(CI_LOW, self.median), m.get(CI_HIGH, self.median)

    @property
    def commit(self) -> str:
        return short(self.sweep.data.tags) or self.sweep.data.tags.get("git_commit", "")[:10] or "?"

    @property
    def when(self) -> str:
        return datetime.fromtimestamp(self.sweep.info.start_time / 1000).strftime("%m-%d %H:%M")


Series = dict[tuple[str, str], list[Point]]  # (machine, variant) -> its points in order


def experiment_sweeps(client: Any, experiment: str, until: Any = None) -> tuple[str, list[Any]]:
    """(experiment id, its sweep runs oldest first; with `until`, those started no later)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise UsageError(f"no MLflow experiment named {experiment!r}")
    sweeps = sorted(search_all(client, exp.experiment_id, SWEEP_FILTER), key=lambda r: r.info.start_time)
    if until is not None:
        sweeps = [s for s in sweeps if s.info.start_time <= until.info.start_time]
    return exp.experiment_id, sweeps


def order_key(order: str) -> Any:
    """How the sweeps sort: by start (time) or by their code's commit date, then start (commit)."""
    if order == "commit":
        return lambda s: (s.data.tags.get("code.committed", ""), s.info.start_time)
    return lambda s: s.info.start_time


def series_of(client: Any, sweeps: list[Any], order: str = "time") -> Series:
    """Each (machine, variant)'s points across `sweeps`, in `order`: the runs each sweep measured
    ok (a run a sweep reused from an earlier one is that one's point)."""
    if order not in ORDERS:
        raise UsageError(f"--order {order!r}: choose one of {', '.join(ORDERS)}")
    series: Series = defaultdict(list)
    for sweep in sorted(sweeps, key=order_key(order)):
        for name, run in ok_runs(client, sweep.info.run_id).items():
            if MEDIAN in run.data.metrics and run.data.tags.get("mlflow.parentRunId") == sweep.info.run_id:
                series[(machine_of(run), name)].append(Point(name, machine_of(run), sweep, run))
    return dict(sorted(series.items()))


def judge_steps(client: Any, series: Series, min_effect: float = 0.05, alpha: float = 0.05, resamples: int = 2000) -> None:
    """Each point's change against the point before it in its series, by the verdict's rules:
    the variants a pair of sweeps share judged together (Holm across them)."""
    steps: dict[tuple[str, str], dict[str, tuple[Point, Point]]] = defaultdict(dict)
    for points in series.values():
        for before, after in zip(points, points[1:], strict=False):
            steps[(before.sweep.info.run_id, after.sweep.info.run_id)][after.variant] = (before, after)
    for pairs in steps.values():
        judged = judge(client, {n: b.run for n, (b, _) in pairs.items()}, {n: a.run for n, (_, a) in pairs.items()},
                       min_effect, alpha, resamples)  # fmt: skip
        for name, row in judged.items():
            before, after = pairs[name]
            after.judged, after.against = row, before.sweep.info.run_name
            after.ratio = (row["ratio"], row["ratio_ci_low"], row["ratio_ci_high"])
            after.change = row["verdict"] if row["verdict"] in ("slower", "faster") else None


def judge(
    client: Any, base_runs: Mapping[str, Any], cand_runs: Mapping[str, Any], min_effect: float, alpha: float, resamples: int
) -> dict[str, dict[str, Any]]:
    """{variant: the verdict's row} of the variants both run sets have samples for, as compare
    judges two sweeps (its disturbance rule from each run's machine-speed probe and shared cores)."""
    base, _, base_cond = sweep_samples(client, base_runs)
    cand, _, cand_cond = sweep_samples(client, cand_runs)
    disturbed, speeds = disturbances(base_cond, cand_cond, min_effect)
    report = compare_sweeps(base, cand, min_effect, alpha, resamples, disturbed=disturbed, speeds=speeds)
    return {r["variant"]: r for r in report["variants"]}


def history_rows(series: Series) -> list[dict[str, str]]:
    """One row per point: the table `report --history` prints."""
    rows = []
    for (machine, variant), points in series.items():
        for p in points:
            low, high = p.interval
            rows.append({
                "variant": variant,
                "machine": machine,
                "sweep": p.sweep.info.run_name,
                "commit": p.commit,
                "median_ms": f"{p.median:.4g}",
                "median_95ci": f"[{low:.4g}, {high:.4g}]",
                "change": f"{p.change} {p.ratio[0]:.3f}x vs {p.against}" if p.change and p.ratio else "",
            })
    return rows


def change_lines(series: Series) -> list[str]:
    """The sweeps where a variant changed, one line each, or one line saying none did."""
    lines = [
        f"{p.sweep.info.run_name} (code {p.commit}): {p.variant} {p.change}, {p.ratio[0]:.3f}x "
        f"[{p.ratio[1]:.3f}, {p.ratio[2]:.3f}] vs {p.against}" + (f" ({p.judged['disturbed']})" if p.judged.get("disturbed") else "")
        for points in series.values()
        for p in points
        if p.change and p.ratio
    ]
    machines = len({m for m, _ in series})
    head = f"{sum(len(p) for p in series.values())} measurements of {len(series)} variant(s) on {machines} machine(s)"
    return [head + (": changes" if lines else ": no variant changed between consecutive sweeps"), *("  " + x for x in lines)]


def history_of(client: Any, experiment: str, order: str = "time", until: Any = None) -> tuple[list[Any], Series]:
    """(the sweeps, each variant's judged series) of `experiment` (up to the sweep `until`)."""
    _, sweeps = experiment_sweeps(client, experiment, until)
    if not sweeps:
        raise UsageError(f"no sweep run in experiment {experiment!r}")
    series = series_of(client, sweeps, order)
    judge_steps(client, series)
    return sweeps, series


def sweeps_text(sweeps: list[Any], series: Series, order: str) -> str:
    """How many sweeps there are and how many measured a point: a sweep that reused every
    variant (tracking.resume) adds none, its runs are an earlier sweep's."""
    measured = len({p.sweep.info.run_id for points in series.values() for p in points})
    return f"{len(sweeps)} sweeps, {measured} of them measured, {order} order"


def plot_title(experiment: str, sweeps: list[Any], series: Series, order: str) -> str:
    return f"{experiment}: median latency per sweep ({sweeps_text(sweeps, series, order)})"
