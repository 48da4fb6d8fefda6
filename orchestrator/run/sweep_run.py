"""One sweep's variants in step with their tasks: SweepRun records each planned variant's run
in the tracking store and ends it ok, failed, skipped or aborted, whatever the tasks return."""

from __future__ import annotations

import json
import os
import platform
import socket
import threading
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from orchestrator.common.console import say
from orchestrator.common.outcome import Outcome, Status
from orchestrator.common.signals import deferred
from orchestrator.plan.planner import Plan
from orchestrator.plan.variant import Variant
from orchestrator.read import draw
from orchestrator.read.alert import alert_lines, hold, named_sweep
from orchestrator.read.summary import parity_value, summary_rows
from orchestrator.record.links import ui_command, ui_lines
from orchestrator.record.revision import Revisions, library_lines, revision_lines
from orchestrator.record.tracking import Tracker
from orchestrator.run import app_loops, recording
from orchestrator.run.progress import Progress
from orchestrator.run.recording import axes, config_yaml
from orchestrator.run.scheduler import Scheduler, beside
from tasks.measure.bench import pool_repeats
from tasks.paired import PairOptions, PairSpec
from tasks.specs import AppLoopResult, BenchResult, ExportResult, Failure
from tasks.worker.envs import said

HEARTBEAT_S = 30.0  # how often the sweep's run is told its driver is alive
HEARTBEAT_TIMEOUT_S = 600.0  # a run whose driver (on another host) was silent this long is closed


class SweepRun:
    """Drives one invocation: every planned variant ends ok, failed, skipped or aborted, in MLflow."""

    def __init__(self, plan: Plan, out_dir: Path, tracker: Tracker, sched: Scheduler):
        self.plan, self.out_dir, self.tracker, self.sched = plan, out_dir, tracker, sched
        self.outcomes: dict[str, Outcome] = {}
        self.pairs: dict[str, dict[str, Any]] = {}  # hydra.launcher.pair: candidate -> its pair's row
        self.loops: dict[str, AppLoopResult | None] = {}  # phase=captured: prompt variant -> its application on the runtime
        self.parent: str | None = None
        self.command: str | None = None  # the sweep's command line, once its plan is recorded
        self.repeats: dict[str, list[BenchResult]] = {}  # variant -> results of its processes so far
        self.envs: dict[str, dict[str, str]] = {}  # variant -> its env.* tags: where it ran, library versions
        self.progress = Progress.of(plan)  # counts, ETA, and each ended variant's line
        self.pyplot: threading.Thread | None = None  # the plots' import, beside the exports
        # who owns the open runs: a later sweep closes them if this driver dies
        self.driver = {"driver.host": socket.gethostname(), "driver.pid": str(os.getpid())}

    # -- planned ----------------------------------------------------------------------
    def _tags(self, name: str, v: Variant) -> dict[str, str]:
        return {**axes(v), **self.revisions.of(name), "overrides": " ".join(v.overrides), **self.driver}

    def close_orphans(self) -> None:
        """Runs a dead driver left RUNNING (kill -9, a lost node) end KILLED with the reason."""
        for run, why in self.tracker.orphans(HEARTBEAT_TIMEOUT_S):
            self.tracker.log(run.info.run_id, tags={"status": Status.ABORTED, "error": f"closed by a later sweep: {why}"})
            self.tracker.end(run.info.run_id, "KILLED")
            say(f"  closed    {run.info.run_name}: left RUNNING, {why}")

    def record_plan(self, command: str, earlier: dict[str, Any] | None = None) -> None:
        self.command = command
        self.revisions = Revisions(self.plan, search=(os.getcwd(),))  # git, once per sweep
        cfg = self.plan.point.tracking
        if cfg.baseline is not None and cfg.baseline_last() is None:  # a named baseline that is not there: before any run
            named_sweep(self.tracker.client, self.tracker.experiment_id, cfg.baseline)
        self.close_orphans()
        if earlier is None:
            earlier = self.tracker.finished_ok() if self.plan.point.tracking.resume else {}
        plan = self.plan
        params = {"command": command, "variants": len(plan.variants), "skipped": len(plan.skipped)}
        params |= {"exports": len(plan.exports), "bench_order_seed": self.sched.seed}
        if plan.excluded:
            params["excluded"] = sum(len(e.jobs) for e in plan.excluded)
        tags = {**self.revisions.sweep, "host": platform.node(), "out_dir": str(self.out_dir), **self.driver}
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        self.parent = self.tracker.start_sweep(f"sweep_{stamp}", params, {**tags, "driver.heartbeat": f"{time.time():.0f}"})
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
            tags = {**self._tags(pv.name, v), "status": Status.PLANNED, "export_key": v.export_key, "bench_key": v.bench_key}
            run_id = self.tracker.start_variant(self.parent, pv.name, tags, v.params, config_yaml(pv.config, v.model.revision))
            self.outcomes[pv.name] = Outcome(pv.name, run_id=run_id, axes=axes(v))
        for s in self.plan.skipped:
            tags = {**self._tags(s.name, s.variant), "status": Status.SKIPPED, "skip_reason": s.reason}
            run_id = self.tracker.start_variant(self.parent, s.name, tags, s.variant.params, config_yaml(s.config, s.variant.model.revision))
            self.tracker.end(run_id, "FINISHED")
            self.outcomes[s.key] = Outcome(s.name, Status.SKIPPED, run_id, axes(s.variant), error=s.reason)
        if self.plan.captures:  # each application's own figures and the calls it made
            self.plan.captures.record(self.tracker, self.parent, self.phases())
        if reused:
            self.tracker.log(self.parent, params={"reused": len(reused)})
            self.tracker.log_dict(self.parent, reused, "reused.json")
            say(f"  reused    {len(reused)} variant(s) already measured ok with the same bench key (tracking.resume)")

    def phases(self) -> dict[str, Any]:
        return {pv.name: pv.variant.phase for pv in self.plan.variants}

    def reuse(self, name: str, v: Variant, run: Any) -> None:
        o = Outcome(name, Status.OK, run.info.run_id, axes(v), reused_from=run.info.run_id)
        o.metrics = dict(run.data.metrics)
        o.series = self.tracker.series(run)  # its depth series, for the plots
        o.shapes = {k.removeprefix("shape."): json.loads(p) for k, p in run.data.params.items() if k.startswith("shape.")}
        o.unstable = run.data.tags.get("unstable") == "True"
        self.envs[name] = {k: v for k, v in run.data.tags.items() if k.startswith("env.")}
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

    # -- the sweep's tasks ----------------------------------------------------------------
    def measure(self, command: str) -> None:
        """Record the plan while Ray starts, then run every export and benchmark to its end."""
        sched = self.sched
        # a local Ray's servers import torch & co. while Ray starts and the plan is recorded
        sched.start_fork_servers(self.plan.fork_servers(lambda spec: not sched.holds(spec)))
        with beside(self.record_plan, command):  # the plan's runs are written while Ray starts
            sched.start()
        for line in self.links():
            say(line)
        with self.progress.showing() as progress:
            self.start()
            self.pyplot = draw.importing()
            for kind, key, result in sched.results():
                if kind in ("export", "bench"):
                    progress.returned(kind, key)  # before `running`: it no longer lists the task
                progress.running([(t.kind, t.key) for t in sched.running.values()])
                self.on_result(kind, key, result)

    def on_result(self, kind: str, key: str, result: Any) -> None:
        if kind == "tick":
            self.heartbeat()
            self.progress.tick()
        elif kind == "retry":
            self.on_retry(key, result)
        elif kind == "pair":
            self.on_pair(key, result)
        elif kind == "apploop":
            self.on_app_loop(key, result)
        elif kind == "export":
            self.on_export(key, result)
        else:
            self.on_bench(key, result)

    def links(self) -> list[str]:
        return ui_lines(self.tracker.uri, self.tracker.experiment_id, self.parent)

    def say_end(self, text: str, reused: bool) -> None:
        """The summary, then where to look: the report's command (nothing new measured, no plots
        drawn) or the UI's, and the sweep's links."""
        say("\n" + text)
        if reused:
            say(f"plots: python -m orchestrator.report {self.parent} --out report.md")
        else:
            say(f"\nBrowse the runs:  {ui_command(self.tracker.uri, self.tracker.experiment_id)}")
        for line in self.links():
            say(line)

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
        for pair in self.plan.pairs:  # each side's export stays shipped until its pair has run
            for name in pair:
                self.sched.reserve(self.plan.variant(name).bench.export_dir)
        for pair in self.plan.pairs:
            self.maybe_pair(pair)

    # -- A/B pairs ------------------------------------------------------------------------
    def maybe_pair(self, pair: tuple[str, str]) -> None:
        """Once both sides of a pair are measured ok, their interleaved timing is queued;
        once either ended otherwise, the pair is dropped."""
        a, b = pair
        if b in self.pairs or not all(self.outcomes[n].ended for n in pair):
            return
        if all(self.outcomes[n].status == Status.OK for n in pair):
            base, cand = self.plan.variant(a).bench, self.plan.variant(b).bench
            seconds = 2 * max(base.bench.max_seconds, cand.bench.max_seconds)  # both sides' time caps
            spec = PairSpec(b, base, cand, PairOptions(max_seconds=seconds, seed=self.sched.seed))
            self.pairs[b] = {"baseline": a, "candidate": b, "verdict": "queued"}
            self.sched.submit("pair", f"{a}|{b}", spec, self.plan.variant(b).request)
            return
        self.pairs[b] = {"baseline": a, "candidate": b, "verdict": "not timed: a side did not end ok"}
        for name in pair:
            self.sched.release(self.plan.variant(name).bench.export_dir)

    def on_pair(self, key: str, result: Any) -> None:
        a, b = key.split("|")
        self.pairs[b] = recording.log_pair(self.tracker, self.outcomes[a], self.outcomes[b], result)
        say(f"  paired    {b:<44} {self.pairs[b]['verdict']} vs {a}: {self.pairs[b]['ratio']}")

    def app_loop(self, name: str) -> None:
        """phase=captured: once every variant of a captured job ended ok, its application runs again on its runtime."""
        for key, spec, request in app_loops.ready(self.plan, name, self.outcomes):
            if key not in self.loops:
                self.loops[key] = None
                self.sched.submit("apploop", key, spec, request)

    def on_app_loop(self, key: str, result: AppLoopResult | Failure) -> None:
        self.loops[key] = result if isinstance(result, AppLoopResult) else AppLoopResult(key, False, failure=result)
        t = self.loops[key].timings
        said = f"TTFT {t['app_ttft_ms']:.2f} ms, inter-token {t['app_inter_token_ms_mean']:.3f} ms mean" if self.loops[key].ok else ""
        said += f", tokens as on transformers {self.loops[key].tokens_agree:.0%}" if said else ""
        say(f"  app loop  {key:<44} {said or 'failed: ' + self.loops[key].failure.error}")

    def on_export(self, key: str, result: ExportResult | Failure) -> None:
        if self.pyplot is not None:  # no benchmark beside the driver's own import
            self.pyplot.join()
            self.pyplot = None
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
            recording.log_export(self.tracker, o.run_id, result, {"status": Status.RUNNING, **model})
            o.status = Status.RUNNING
            pv = self.plan.variant(name)
            for r in range(pv.bench.bench.repeats):  # each in a fresh process; the scheduler interleaves them
                self.sched.submit("bench", f"{name}#{r}", pv.bench, pv.request)
            say(f"  exported  {name:<44} {result.export_seconds:6.1f}s {'(cache hit)' if result.cache_hit else ''}{said(result.details)}")

    def log_model(self, key: str, export: ExportResult) -> dict[str, str]:
        """The exported model, once on the sweep's run however many variants use it."""
        if not export.artifact:  # eager-style backends run the graph module itself
            return {}
        planned = self.plan.exports[key].spec.out_dir
        folder = partial(self.sched.export_folder, planned, export.out_dir)  # on this machine
        limit = self.plan.point.tracking.max_model_mb
        return recording.log_model(self.tracker, self.parent, export, planned, folder, limit)

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
        o.series = result.series
        o.unstable = bool(result.metrics.get("unstable", 0.0))
        self.envs[name] = {f"env.{k}": v for k, v in result.env.items()}
        recording.log_bench(self.tracker, name, o.run_id, result)
        if result.profile:
            recording.log_profile(self.tracker, o, result.profile, self.out_dir)
        if not result.ok:
            self.fail(o, result.failure)
            return
        o.status = Status.OK
        self.tracker.log(o.run_id, tags={"status": Status.OK, "unstable": o.unstable, "parity": "passed"})
        self.tracker.end(o.run_id, "FINISHED")
        self.pairs_of(name)
        self.app_loop(name)
        self.progress.ended(
            name,
            Status.OK,
            f"  measured  {name:<44} {o.metrics['latency_ms_median']:8.3f} ms median, parity "
            f"{parity_value(o.metrics)}{'  UNSTABLE' if o.unstable else ''}{said(result.params)}",
        )

    def fail(self, o: Outcome, failure: Failure) -> None:
        o.status, o.stage, o.error = Status.FAILED, failure.stage, failure.error
        self.tracker.log_failure(o.run_id, failure.stage, failure.error, failure.traceback)
        if failure.stage == "parity":
            self.tracker.log(o.run_id, tags={"parity": "failed"})
        self.tracker.end(o.run_id, "FAILED")
        self.progress.ended(o.name, Status.FAILED, f"  FAILED    {o.name:<44} {failure.stage}: {failure.error}")
        self.pairs_of(o.name)

    def pairs_of(self, name: str) -> None:
        for pair in self.plan.pairs:
            if name in pair:
                self.maybe_pair(pair)

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
    def finish(self, seconds: float, plots: bool = True) -> str:
        """The sweep's run: its counts, summary and (with `plots`) plots; closed. Returns the summary's text."""
        outs = list(self.outcomes.values())
        counts = {s.value: sum(o.status == s for o in outs) for s in (Status.OK, Status.FAILED, Status.SKIPPED)}
        failed = counts[Status.FAILED] > 0
        self.tracker.log(
            self.parent,
            metrics={f"variants_{k}": v for k, v in counts.items()} | {"sweep_seconds": seconds},
            tags={"status": Status.FAILED if failed else Status.OK},
        )
        pairs = list(self.pairs.values())
        notes = [*revision_lines(self.revisions.sweep), *library_lines(self.envs), *self.held()]
        text = recording.log_summary(
            self.tracker, self.parent, self.plan, self.outcomes, summary_rows(outs), self.out_dir, pairs, plots, notes,
            {k: r.timings | {"tokens_agree": r.tokens_agree} for k, r in self.loops.items() if r is not None and r.ok},
            self.command,
        )
        self.tracker.end(self.parent, "FAILED" if failed else "FINISHED")
        return text

    def held(self) -> list[str]:
        """tracking.baseline: each variant this sweep measured judged against its baseline
        (orchestrator/read/alert.py), tagged on its run; an alert on its outcome too (the exit status)."""
        cfg = self.plan.point.tracking
        if cfg.baseline is None:
            return []
        rows = hold(self.tracker.client, self.parent, cfg)
        for r in rows:
            o = self.outcomes[r["variant"]]
            o.alert = r["alert"] or None
            tags = {"alert.verdict": r["verdict"], "alert.ratio": r["ratio"], "alert.baseline": r["baseline"]}
            self.tracker.log(o.run_id, tags=tags | ({"alert": r["alert"]} if r["alert"] else {}))
        alerts = [r["variant"] for r in rows if r["alert"]]
        self.tracker.log(self.parent, metrics={"alerts": len(alerts)}, tags={"alert.baseline": cfg.baseline, "alert.variants": ", ".join(alerts)})
        return alert_lines(cfg, rows)

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
