"""The one entry point for a single run and a sweep alike: validate -> plan -> export ->
benchmark -> record. `run_sweep` reads top to bottom as a sweep's life; SweepRun
(orchestrator/run/sweep_run.py) keeps each variant's run in the tracking store in step with its tasks."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from orchestrator.plan.checks import check_writable
from orchestrator.plan.config import SweepPoint, validate_all
from orchestrator.plan.grid import GridRules, grid_rules
from orchestrator.plan.planner import Plan, make_plan
from orchestrator.record.store import Store
from orchestrator.record.tracking import Tracker
from orchestrator.run.dry_run import say_dry_run, say_plan
from orchestrator.run.fork_hosts import ForkServers
from orchestrator.run.scheduler import Scheduler
from orchestrator.run.sweep_run import SweepRun


def run_sweep(
    configs: Sequence[DictConfig], overrides: list[list[str]], out_dir: Path, command: str,
    dry_run: bool = False, grid: dict[str, Any] | None = None, forks: ForkServers | None = None,
) -> dict[int, Any]:
    """Validate every config and the grid's rules, plan the grid on the cluster, run the
    exports and benchmarks, record them; returns each Hydra job's outcome by job index. Bad
    configs raise ConfigError before Ray starts and before any run exists. `dry_run` prints
    the plan and runs nothing: on a local cluster it starts no Ray (the plan is made for
    this machine's capacity as a local Ray would see it) and it creates no MLflow store.
    `forks`: fork servers begun before the configs were composed (ForkServers.warm); the
    caller ends them when this raises before a scheduler holds them."""
    t0 = time.perf_counter()
    points = validate_all(configs, overrides)
    rules = grid_rules(**(grid or {}))
    cluster = points[0].cluster  # the sweep-wide groups: one setting for every job (validate_all)
    store = None if dry_run else Store.checked(points[0].tracking)  # before any work: the plan carries it
    if not dry_run and cluster.address is None:  # a local Ray's tasks write this machine's export cache
        check_writable("cluster.export_cache", cluster.export_cache)
    sched = Scheduler(cluster, forks=forks)  # a local Ray: planned on this machine as measured, started below
    try:  # a dry run plans the same way, for this machine or on a cluster joined and left, and runs no capture
        plan = plan_on(sched, points, configs, overrides, rules, store)
        say_plan(plan)
        # the plan's store opened: MLflow's import and the store's opening beside Ray's start (SweepRun.measure)
        tracker = None if dry_run else Tracker(plan.store, background=True)
    except BaseException:
        sched.stop()
        raise
    if dry_run:
        sched.stop()
        say_dry_run(plan)
        return {}
    if not plan.variants and not plan.skipped:
        return {}
    run: SweepRun | None = None
    try:  # a signal or an error anywhere from here, Ray's shutdown and the summary included, closes every open run
        try:
            run = SweepRun(plan, out_dir, tracker, sched)
            earlier = reusable(plan, tracker, sched)
            if earlier is None:
                run.measure(command)
            else:  # every variant measured ok before: recorded as reused, no Ray started, no server needed
                sched.forks.stop()
                run.record_plan(command, earlier)
        except BaseException:
            sched.stop()
            raise
        with sched.stopping():  # Ray's shutdown, seconds of waiting on its processes, beside the summary and plots
            # a sweep that measured nothing new draws no plots (most of its time): orchestrator.report draws them
            text = run.finish(time.perf_counter() - t0, plots=earlier is None)
    except BaseException as e:
        if run is not None:
            run.abort(f"{type(e).__name__}: {e}")
        raise
    run.say_end(text, reused=earlier is not None)
    return run.by_job()


def plan_on(sched: Scheduler, points: list[SweepPoint], configs: Sequence[DictConfig], overrides: list[list[str]],
            rules: GridRules, store: Store | None) -> Plan:  # fmt: skip
    """The plan on the cluster's capacity (a cluster to join is started first, to read it),
    any captured application run on it first (a dry run, with no `store`, runs none)."""
    if sched.capacity is None:  # a cluster to join (or a Ray this process runs): its capacity is read from it
        sched.start()
    return make_plan(points, configs, overrides, sched.capacity, rules, store, runner=None if store is None else sched)


def reusable(plan: Plan, tracker: Tracker, sched: Scheduler) -> dict[str, Any] | None:
    """The runs that measured every planned variant ok before (tracking.resume), when a local
    Ray is not started yet and the store exists: then nothing needs Ray. Else None."""
    tracking = plan.point.tracking
    if not (tracking.resume and sched.own_local and not sched.started and plan.variants and not plan.captures):
        return None
    uri = tracker.uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None  # a new store holds nothing: its check would only delay Ray's start
    earlier = tracker.finished_ok()
    return earlier if all(pv.variant.bench_key in earlier for pv in plan.variants) else None
