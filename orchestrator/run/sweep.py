"""The one entry point for a single run and a sweep alike: validate -> plan -> export ->
benchmark -> record. `run_sweep` reads top to bottom as one grid point's life."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.common.console import say, table
from orchestrator.common.outcome import Outcome, Status
from orchestrator.common.signals import deferred
from orchestrator.plan.capture import Captures, wants_capture
from orchestrator.plan.config import validate_all
from orchestrator.plan.grid import GridRules, grid_rules
from orchestrator.plan.placement import capacity_text, local_capacity
from orchestrator.plan.planner import Plan, make_plan
from orchestrator.plan.variant import Variant
from orchestrator.read.summary import plan_text, summary_rows
from orchestrator.record.links import ui_command, ui_lines
from orchestrator.record.store import resolve_uri
from orchestrator.record.tracking import Tracker, existing_runs
from orchestrator.run.progress import Progress
from orchestrator.run.scheduler import Scheduler, beside
from tasks.export import _anatomy as anatomy
from tasks.measure.bench import pool_repeats
from tasks.phases import label
from tasks.specs import BenchResult, ExportResult, Failure

HEARTBEAT_S = 30.0  # how often the sweep's run is told its driver is alive
HEARTBEAT_TIMEOUT_S = 600.0  # a run whose driver (on another host) was silent this long is closed


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _config_yaml(cfg: DictConfig) -> str:
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    return OmegaConf.to_yaml(cfg, resolve=True)


def _axes(v: Variant) -> dict[str, str]:
    return {"model": v.model.name, "phase": label(v.phase), "backend": v.backend.name, "device": v.device.name}


class SweepRun:
    """Drives one invocation: every planned variant ends ok, failed, skipped or aborted, in MLflow."""

    def __init__(self, plan: Plan, out_dir: Path, tracker: Tracker, sched: Scheduler):
        self.plan, self.out_dir, self.tracker, self.sched = plan, out_dir, tracker, sched
        self.outcomes: dict[str, Outcome] = {}
        self.parent: str | None = None
        self.repeats: dict[str, list[BenchResult]] = {}  # variant -> results of its processes so far
        self.progress = Progress.of(plan)  # counts, ETA, and each ended variant's line
        # who owns the open runs: a later sweep closes them if this driver dies
        self.driver = {"driver.host": socket.gethostname(), "driver.pid": str(os.getpid())}

    # -- planned ----------------------------------------------------------------------
    def _tags(self, v: Variant) -> dict[str, str]:
        return {**_axes(v), "git_commit": self.commit, "overrides": " ".join(v.overrides), **self.driver}

    def close_orphans(self) -> None:
        """Runs a dead driver left RUNNING (kill -9, a lost node) end KILLED with the reason."""
        for run, why in self.tracker.orphans(HEARTBEAT_TIMEOUT_S):
            self.tracker.log(run.info.run_id, tags={"status": Status.ABORTED, "error": f"closed by a later sweep: {why}"})
            self.tracker.end(run.info.run_id, "KILLED")
            say(f"  closed    {run.info.run_name}: left RUNNING, {why}")

    def record_plan(self, command: str) -> None:
        self.commit = _git_commit()
        self.close_orphans()
        earlier = self.tracker.finished_ok() if self.plan.point.tracking.resume else {}
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        self.parent = self.tracker.start_sweep(
            f"sweep_{stamp}",
            params={
                "command": command,
                "variants": len(self.plan.variants),
                "skipped": len(self.plan.skipped),
                "exports": len(self.plan.exports),
                "bench_order_seed": self.sched.seed,
                **({"excluded": sum(len(e.jobs) for e in self.plan.excluded)} if self.plan.excluded else {}),
            },
            tags={
                "git_commit": self.commit,
                "host": platform.node(),
                "out_dir": str(self.out_dir),
                **self.driver,
                "driver.heartbeat": f"{time.time():.0f}",
            },
        )
        self.beat = time.monotonic()
        if self.plan.excluded:  # left out by the grid's rules: no run each, one list on the sweep's run
            rows = [{"point": e.key, "jobs": list(e.jobs), "rule": e.rule} for e in self.plan.excluded]
            self.tracker.log_dict(self.parent, rows, "excluded.json")
        reused = {}
        for pv in self.plan.variants:
            v = pv.variant
            if v.bench_key in earlier:  # measured ok before with exactly this work: linked, not redone
                self.reuse(pv.name, v, earlier[v.bench_key])
                reused[pv.name] = earlier[v.bench_key].info.run_id
                continue
            tags = {**self._tags(v), "status": Status.PLANNED, "export_key": v.export_key, "bench_key": v.bench_key}
            run_id = self.tracker.start_variant(self.parent, pv.name, tags, v.params, _config_yaml(pv.config))
            self.outcomes[pv.name] = Outcome(pv.name, run_id=run_id, axes=_axes(v))
        for s in self.plan.skipped:
            tags = {**self._tags(s.variant), "status": Status.SKIPPED, "skip_reason": s.reason}
            run_id = self.tracker.start_variant(self.parent, s.name, tags, s.variant.params, _config_yaml(s.config))
            self.tracker.end(run_id, "FINISHED")
            self.outcomes[s.key] = Outcome(s.name, Status.SKIPPED, run_id, _axes(s.variant), error=s.reason)
        if self.plan.captures:  # each application's own figures and the calls it made
            self.plan.captures.record(self.tracker, self.parent, self.phases())
        if reused:
            self.tracker.log(self.parent, params={"reused": len(reused)})
            self.tracker.log_dict(self.parent, reused, "reused.json")
            say(f"  reused    {len(reused)} variant(s) already measured ok with the same bench key (tracking.resume)")

    def phases(self) -> dict[str, Any]:
        return {pv.name: pv.variant.phase for pv in self.plan.variants}

    def reuse(self, name: str, v: Variant, run: Any) -> None:
        o = Outcome(name, Status.OK, run.info.run_id, _axes(v), reused_from=run.info.run_id)
        o.metrics = dict(run.data.metrics)
        o.shapes = {k.removeprefix("shape."): json.loads(p) for k, p in run.data.params.items() if k.startswith("shape.")}
        o.unstable = run.data.tags.get("unstable") == "True"
        self.outcomes[name] = o
        self.progress.ended(name, Status.OK)

    def heartbeat(self) -> None:
        """The sweep's run says its driver is alive, so a later sweep elsewhere can tell."""
        if time.monotonic() - self.beat >= HEARTBEAT_S:
            self.tracker.log(self.parent, tags={"driver.heartbeat": f"{time.time():.0f}"})
            self.beat = time.monotonic()

    def on_retry(self, key: str, cause: str) -> None:
        """A task whose process died runs again: each affected variant records it."""
        kind, _, name = key.partition(":")
        names = self.plan.exports[name].variants if kind == "export" else (name.rsplit("#", 1)[0],)
        for n in names:
            o = self.outcomes[n]
            if o.ended:  # failed before (schedule, an earlier repeat) or reused: its run is closed, or an earlier sweep's
                continue
            o.retries.append(f"{kind}: {cause}")
            self.tracker.log(o.run_id, metrics={"retries": len(o.retries)}, tags={"retry_causes": " | ".join(o.retries)})
            say(f"  retry     {n}: {kind} {cause}")

    # -- export ---------------------------------------------------------------------------
    def start(self) -> None:
        """Variants no node can run (device=cuda on a cluster without GPUs) fail now, before
        their exports; the exports the others need are queued."""
        for pv in self.plan.variants:
            if pv.unplaceable:
                self.fail(self.outcomes[pv.name], Failure("schedule", pv.unplaceable))
            elif pv.warning:
                say(f"  warning   {pv.name}: {pv.warning}")
        for key, job in self.plan.exports.items():
            if any(not self.outcomes[name].ended for name in job.variants):
                self.sched.submit("export", key, job.spec, job.request)

    def on_export(self, key: str, result: ExportResult | Failure) -> None:
        model = self.log_model(key, result) if isinstance(result, ExportResult) and result.ok else {}
        for name in self.plan.exports[key].variants:
            o = self.outcomes[name]
            if o.ended:
                continue
            if isinstance(result, Failure) or not result.ok:
                self.fail(o, result if isinstance(result, Failure) else result.failure)
                continue
            o.shapes = result.input_shapes
            o.metrics.update(export_seconds=result.export_seconds, artifact_mb=result.artifact_mb)
            self.tracker.log(
                o.run_id,
                metrics={
                    "export_seconds": result.export_seconds,
                    "artifact_mb": result.artifact_mb,
                    **(anatomy.headline(result.anatomy) if result.anatomy else {}),
                },
                params={
                    **{f"shape.{n}": s for n, s in result.input_shapes.items()},
                    **{f"export.{k}": v for k, v in result.details.items()},
                },
                tags={
                    "status": Status.RUNNING,
                    "export_cache_hit": result.cache_hit,
                    "export_dir": result.out_dir,  # on the node that made it
                    **model,
                },
            )
            if result.anatomy:  # what is inside the artifact: the whole record and its op histogram
                self.tracker.log_dict(o.run_id, result.anatomy, anatomy.ARTIFACT)
                self.tracker.log_table(o.run_id, anatomy.rows(result.anatomy), anatomy.TABLE)
            o.status = Status.RUNNING
            pv = self.plan.variant(name)
            for r in range(pv.bench.bench.repeats):  # each in a fresh process; the scheduler interleaves them
                self.sched.submit("bench", f"{name}#{r}", pv.bench, pv.request)
            say(f"  exported  {name:<44} {result.export_seconds:6.1f}s {'(cache hit)' if result.cache_hit else ''}")

    def log_model(self, key: str, export: ExportResult) -> dict[str, str]:
        """The exported model (and its external weights), stored once on the sweep's run under
        exports/<entry>/ however many variants use it; each of them is tagged with where it
        is (`model_artifact`). Larger than tracking.max_model_mb: a tag says where it stayed."""
        if not export.artifact:  # eager-style backends run the graph module itself
            return {}
        limit = self.plan.point.tracking.max_model_mb
        if limit is not None and export.artifact_mb > limit:
            return {
                "model_not_logged": f"{export.artifact_mb:.0f} MB > tracking.max_model_mb="
                f"{limit:g}; the model is in {export.out_dir}"
            }
        planned = self.plan.exports[key].spec.out_dir
        folder = self.sched.export_folder(planned, export.out_dir)  # on this machine
        name = Path(export.artifact).name
        where = f"exports/{Path(planned).name}"
        for f in sorted(folder.glob(name + "*")):  # model.onnx, model.onnx.data
            self.tracker.artifact(self.parent, f, where)
        return {"model_artifact": f"{self.tracker.artifact_uri(self.parent)}/{where}/{name}"}

    # -- benchmark --------------------------------------------------------------------
    def on_bench(self, key: str, result: BenchResult | Failure) -> None:
        """One benchmark process ended (`key` is `name#repeat`); the variant is recorded
        once all its processes have, their samples pooled."""
        name = key.rsplit("#", 1)[0]
        o = self.outcomes[name]
        if o.ended:  # an earlier process of this variant failed it already
            return
        if isinstance(result, Failure):
            self.fail(o, result)
            return
        done = self.repeats.setdefault(name, [])
        done.append(result)
        bench = self.plan.variant(name).bench.bench
        if len(done) < bench.repeats and result.ok:
            return
        self.record_bench(name, pool_repeats(done, bench))

    def record_bench(self, name: str, result: BenchResult) -> None:
        o = self.outcomes[name]
        o.metrics.update(result.metrics)
        o.unstable = bool(result.metrics.get("unstable", 0.0))
        self.tracker.log(
            o.run_id,
            metrics=result.metrics,
            params={f"runtime.{k}": v for k, v in result.params.items()},
            tags={f"env.{k}": v for k, v in result.env.items()},
        )
        if result.parity:
            self.tracker.log_dict(o.run_id, result.parity, "parity.json")
        if result.samples_ns:
            samples = {"variant": name, "unit": "ns", "first_call_ns": result.first_call_ns, "samples": result.samples_ns}
            self.tracker.log_dict(o.run_id, samples, "latency_samples.json", indent=None)
        if result.profile:  # bench.profile: the top ops as a table and a chart
            self.log_profile(o, result.profile)
        if not result.ok:
            self.fail(o, result.failure)
            return
        o.status = Status.OK
        self.tracker.log(o.run_id, tags={"status": Status.OK, "unstable": o.unstable, "parity": "passed"})
        self.tracker.end(o.run_id, "FINISHED")
        self.progress.ended(
            name,
            Status.OK,
            f"  measured  {name:<44} {o.metrics['latency_ms_median']:8.3f} ms median, parity "
            f"{o.metrics['parity_max_abs_diff']:.1e}{'  UNSTABLE' if o.unstable else ''}",
        )

    def log_profile(self, o: Outcome, rows: list[dict[str, Any]]) -> None:
        from orchestrator.read.plots import profile_plot
        from tasks.measure.profiles import CHART, TABLE

        self.tracker.log_table(o.run_id, rows, TABLE)
        folder = self.out_dir / "profiles" / o.name
        folder.mkdir(parents=True, exist_ok=True)
        if profile_plot(rows, o.name, folder / CHART):
            self.tracker.artifact(o.run_id, folder / CHART)

    def fail(self, o: Outcome, failure: Failure) -> None:
        o.status, o.stage, o.error = Status.FAILED, failure.stage, failure.error
        self.tracker.log_failure(o.run_id, failure.stage, failure.error, failure.traceback)
        if failure.stage == "parity":
            self.tracker.log(o.run_id, tags={"parity": "failed"})
        self.tracker.end(o.run_id, "FAILED")
        self.progress.ended(o.name, Status.FAILED, f"  FAILED    {o.name:<44} {failure.stage}: {failure.error}")

    def abort(self, why: str) -> None:
        """Ctrl-C or a driver error: close every open run with the reason, lose nothing logged.
        A second Ctrl-C waits until every run is closed."""
        with deferred():
            self._close_open_runs(why)

    def _close_open_runs(self, why: str) -> None:
        for o in self.outcomes.values():
            if not o.ended and o.run_id:
                self.tracker.log(o.run_id, tags={"status": Status.ABORTED, "error": why})
                self.tracker.end(o.run_id, "KILLED")
                o.status, o.error = Status.ABORTED, why
                self.progress.ended(o.name, Status.ABORTED)
        if self.parent:
            self.tracker.log(self.parent, tags={"status": Status.ABORTED, "error": why})
            self.tracker.end(self.parent, "KILLED")

    # -- end ------------------------------------------------------------------------------
    def finish(self, seconds: float) -> str:
        outs = list(self.outcomes.values())
        counts = {s.value: sum(o.status == s for o in outs) for s in (Status.OK, Status.FAILED, Status.SKIPPED)}
        rows = summary_rows(outs)
        text = table(rows)
        failed = counts[Status.FAILED] > 0
        self.tracker.log(
            self.parent,
            metrics={f"variants_{k}": v for k, v in counts.items()} | {"sweep_seconds": seconds},
            tags={"status": Status.FAILED if failed else Status.OK},
        )
        if self.plan.captures:  # the captured phases' benchmarks beside the application's own loop
            beside = self.plan.captures.beside(self.outcomes, self.phases())
            if beside:
                self.tracker.log_dict(self.parent, beside, "captures/benchmark_vs_app.json")
                text += (
                    "\n\nCaptured phases: each benchmark's median beside the application's own loop at that call "
                    "(its eager forward there; the time from one token to the next)\n" + table(beside)
                )
        self.tracker.log_text(self.parent, text + "\n", "summary.txt")
        self.tracker.log_dict(self.parent, rows, "summary.json")
        # the plots (orchestrator.read.plots: the report draws the same from MLflow): latency.png
        # at the root of the sweep's run, the others under plots/
        from orchestrator.read.plots import make_plots, plot_rows
        from orchestrator.read.summary import sweep_note

        params = {pv.name: pv.variant.params for pv in self.plan.variants}
        params.update({s.name: s.variant.params for s in self.plan.skipped})
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for plot in make_plots(plot_rows(outs, params), self.out_dir):
            folder = plot.parent.relative_to(self.out_dir).as_posix()
            self.tracker.artifact(self.parent, plot, None if folder == "." else folder)
        # the UI's view: the run's description (command + table) and the table as an MLflow table
        client = getattr(self.tracker, "client", None)  # MLflow's own; a test's tracker has none
        command = client.get_run(self.parent).data.params.get("command") if client else None
        self.tracker.log(self.parent, tags={"mlflow.note.content": sweep_note(command, rows)})
        if rows:
            self.tracker.log_table(self.parent, rows, "summary_table.json")
        self.tracker.end(self.parent, "FAILED" if failed else "FINISHED")
        return text

    def by_job(self) -> dict[int, Outcome]:
        """Each Hydra job's outcome, by job index: of a job that stands for several variants
        (phase=captured), a failed one if any failed, so the exit status tells."""
        out: dict[int, Outcome] = {}
        for pv in self.plan.variants:
            o = self.outcomes[pv.name]
            for j in pv.jobs:
                if j not in out or (o.status == Status.FAILED and out[j].status != Status.FAILED):
                    out[j] = o
        out.update({s.job: self.outcomes[s.key] for s in self.plan.skipped})
        return out


def _running(sched: Scheduler) -> list[tuple[str, str]]:
    """(kind, key) of the tasks the scheduler has handed Ray (none for a scheduler that does not say)."""
    return [(t.kind, t.key) for t in getattr(sched, "running", {}).values()]


def run_sweep(
    configs: Sequence[DictConfig],
    overrides: list[list[str]],
    out_dir: Path,
    command: str,
    dry_run: bool = False,
    grid: dict[str, Any] | None = None,
) -> dict[int, Any]:
    """Validate every config and the grid's rules, plan the grid on the cluster, run the
    exports and benchmarks, record them; returns each Hydra job's outcome by job index. Bad
    configs raise ConfigError before Ray starts and before any run exists. `dry_run` prints
    the plan and runs nothing: on a local cluster it starts no Ray (the plan is made for
    this machine's capacity as a local Ray would see it) and it creates no MLflow store."""
    t0 = time.perf_counter()
    points = validate_all(configs, overrides)
    rules = grid_rules(**(grid or {}))
    if dry_run:
        dry_run_plan(points, configs, overrides, rules)
        return {}
    tracker = Tracker(points[0].tracking, background=True)  # its checks now; MLflow's import and store beside Ray's start
    run: SweepRun | None = None
    sched = Scheduler(points[0].cluster)  # a local Ray: planned on this machine as measured, started below
    try:  # a signal or an error anywhere from here, Ray's shutdown and the summary included, closes every open run
        try:
            if sched.capacity is None:  # a cluster to join (or a Ray this process runs): its capacity is read from it
                sched.start()
            captures = Captures.of(points, sched.capacity)  # phase=captured: run each application first
            if captures:
                captures.run(sched)
                captures.expand(points)
            plan = make_plan(points, configs, overrides, sched.capacity, rules, captures or None)
            say_plan(plan)
            if not plan.variants and not plan.skipped:
                return {}
            # a local Ray's servers import torch & co. while Ray starts and the plan is recorded
            sched.start_fork_servers(plan.fork_servers(lambda spec: not sched.holds(spec)))
            run = SweepRun(plan, out_dir, tracker, sched)
            with beside(run.record_plan, command):  # the plan's runs are written while Ray starts
                sched.start()
            links = ui_lines(tracker.uri, getattr(tracker, "experiment_id", None), run.parent)
            for line in links:
                say(line)
            with run.progress.showing() as progress:
                run.start()
                for kind, key, result in sched.results():
                    if kind in ("export", "bench"):
                        progress.returned(kind, key)  # before `running`: it no longer lists the task
                    progress.running(_running(sched))
                    if kind == "tick":
                        run.heartbeat()
                        progress.tick()
                    elif kind == "retry":
                        run.on_retry(key, result)
                    else:
                        (run.on_export if kind == "export" else run.on_bench)(key, result)
        except BaseException:
            sched.stop()
            raise
        with sched.stopping():  # Ray's shutdown, seconds of waiting on its processes, beside the summary and plots
            text = run.finish(time.perf_counter() - t0)
    except BaseException as e:
        if run is not None:
            run.abort(f"{type(e).__name__}: {e}")
        raise
    say("\n" + text)
    say(f"\nBrowse the runs:  {ui_command(tracker.uri, getattr(tracker, 'experiment_id', None))}")
    for line in links:
        say(line)
    return run.by_job()


def say_plan(plan: Plan) -> None:
    """The plan's first lines: its counts, each skipped combination, what the rules left out."""
    excluded = f", {sum(len(e.jobs) for e in plan.excluded)} excluded" if plan.excluded else ""
    say(f"phasesweep: {len(plan.variants)} variant(s), {len(plan.exports)} export(s), {len(plan.skipped)} skipped{excluded}")
    for s in plan.skipped:
        say(f"  skipped   {s.name}: {s.reason}")
    if plan.excluded:
        by_rule: dict[str, int] = {}
        for e in plan.excluded:
            by_rule[e.rule] = by_rule.get(e.rule, 0) + len(e.jobs)
        for rule, n in by_rule.items():
            say(f"  excluded  {n} job(s): {rule}")


def dry_run_plan(
    points: list[Any], configs: Sequence[DictConfig], overrides: list[list[str]], rules: GridRules
) -> Plan:
    """The plan, printed, with how many runs the tracking store already holds for each
    variant; nothing runs, no store is created. A local cluster is not started: the plan is
    made for this machine as a local Ray would offer it; an existing cluster is joined (and
    left) to read its capacity."""
    cluster = points[0].cluster
    if cluster.address is None:
        capacity = local_capacity(cluster.num_cpus)
        where = f"this machine as a local Ray would offer it (not started): {capacity_text(capacity)}"
    else:
        with Scheduler(cluster) as sched:
            capacity = sched.capacity
        where = f"the Ray cluster at {cluster.address}: {capacity_text(capacity)}"
    plan = make_plan(points, configs, overrides, capacity, rules)
    say_plan(plan)
    say(f"dry run: planned for {where}")
    standing = sum(1 for pv in plan.variants if wants_capture(pv.variant.phase))
    if standing:
        say(
            f"dry run: {standing} variant(s) read 'captured': each stands for the calls its phase.app makes, up to "
            "phase.capture.max_variants of each kind; a dry run does not run the application"
        )
    tracking = plan.point.tracking
    existing = existing_runs(tracking)
    if existing:
        keys = [pv.variant.bench_key for pv in plan.variants]
        held = sum(1 for k in keys if k in existing)
        ok = sum(1 for k in keys if "ok" in existing.get(k, ()))
        reuse = "reused (tracking.resume)" if tracking.resume else "measured again (tracking.resume=false)"
        say(f"dry run: {held} variant(s) have runs in {resolve_uri(tracking)} already; {ok} ended ok and would be {reuse}")
    else:
        say(f"dry run: no runs in {resolve_uri(tracking)} yet")
    say(plan_text(plan, existing, resume=tracking.resume))
    return plan
