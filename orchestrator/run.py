"""The one entry point for a single run and a sweep alike: compose -> plan -> export ->
benchmark -> record. `run_sweep` reads top to bottom as one grid point's life."""

from __future__ import annotations

import platform
import subprocess
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.plan import Plan, PlannedVariant, make_plan
from orchestrator.report import Outcome, latency_plot, say, summary_rows, table
from orchestrator.scheduler import Scheduler
from orchestrator.tracking import Tracker, ui_command
from orchestrator.variant import Variant
from tasks.specs import BenchResult, BenchSpec, ExportResult, ExportSpec, Failure


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


class SweepRun:
    """Drives one invocation: every planned variant ends ok, failed or skipped, in MLflow."""

    def __init__(self, plan: Plan, out_dir: Path, tracker: Tracker, sched: Scheduler):
        self.plan, self.out_dir, self.tracker, self.sched = plan, out_dir, tracker, sched
        self.outcomes: dict[str, Outcome] = {}
        self.variants: dict[str, PlannedVariant] = {pv.name: pv for pv in plan.variants}

    # -- planned ----------------------------------------------------------------------
    def _tags(self, v: Variant) -> dict[str, str]:
        return {
            "model": v.model.name,
            "phase": v.phase.name,
            "backend": v.backend.name,
            "device": v.device.name,
            "git_commit": self.commit,
            "overrides": " ".join(v.overrides),
        }

    def record_plan(self, command: str) -> None:
        self.commit = _git_commit()
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        self.parent = self.tracker.start_sweep(
            f"sweep_{stamp}",
            params={
                "command": command,
                "variants": len(self.plan.variants),
                "skipped": len(self.plan.skipped),
                "exports": len(self.plan.exports),
            },
            tags={"git_commit": self.commit, "host": platform.node(), "out_dir": str(self.out_dir)},
        )
        for pv in self.plan.variants:
            v = pv.variant
            tags = {**self._tags(v), "status": "planned", "export_key": v.export_key, "bench_key": v.bench_key}
            run_id = self.tracker.start_variant(self.parent, pv.name, tags, v.params, _config_yaml(pv.config))
            self.outcomes[pv.name] = Outcome(pv.name, run_id=run_id)
        for s in self.plan.skipped:
            name = f"{s.name} (job #{s.job})"
            tags = {**self._tags(s.variant), "status": "skipped", "skip_reason": s.reason}
            run_id = self.tracker.start_variant(self.parent, s.name, tags, s.variant.params, _config_yaml(s.config))
            self.tracker.end(run_id, "FINISHED")
            self.outcomes[name] = Outcome(s.name, status="skipped", run_id=run_id, error=s.reason)

    # -- export ---------------------------------------------------------------------------
    def fail_unplaceable(self) -> None:
        """Variants no node can run (device=cuda on a cluster without GPUs) fail now,
        before their exports, instead of waiting for a resource that never comes."""
        for pv in self.plan.variants:
            v = pv.variant
            why = self.sched.placement_error(v.device.name, v.weight_bytes)
            if why:
                self.fail(self.outcomes[pv.name], Failure("schedule", why))
            elif warning := self.sched.memory_warning(v.weight_bytes, v.backend.export_format):
                say(f"  warning   {pv.name}: {warning}")

    def exports_needed(self) -> dict[str, ExportSpec]:
        return {
            key: spec
            for key, spec in self.plan.exports.items()
            if any(not self.outcomes[pv.name].ended for pv in self.plan.by_export(key))
        }

    def on_export(self, key: str, result: ExportResult | Failure) -> None:
        for pv in self.plan.by_export(key):
            o = self.outcomes[pv.name]
            if o.ended:
                continue
            if isinstance(result, Failure) or not result.ok:
                self.fail(o, result if isinstance(result, Failure) else result.failure)
                continue
            o.shapes = result.input_shapes
            o.metrics.update(export_seconds=result.export_seconds, artifact_mb=result.artifact_mb)
            self.tracker.log(
                o.run_id,
                metrics={"export_seconds": result.export_seconds, "artifact_mb": result.artifact_mb},
                params={
                    **{f"shape.{n}": s for n, s in result.input_shapes.items()},
                    **{f"export.{k}": v for k, v in result.details.items()},
                },
                tags={"status": "running", "export_cache_hit": result.cache_hit, "export_dir": result.out_dir},
            )
            if result.artifact:
                self.log_model(o, result)
            o.status = "running"
            self.sched.submit_bench(pv.name, self.bench_spec(pv, result), *pv.resources)
            say(f"  exported  {pv.name:<44} {result.export_seconds:6.1f}s {'(cache hit)' if result.cache_hit else ''}")

    def log_model(self, o: Outcome, export: ExportResult) -> None:
        """The exported model (and its external weights) as artifacts under model/, unless
        it is larger than tracking.max_model_mb: then a tag says where it is instead."""
        limit = self.plan.point.tracking.max_model_mb
        if limit is not None and export.artifact_mb > limit:
            self.tracker.log(
                o.run_id,
                tags={
                    "model_not_logged": f"{export.artifact_mb:.0f} MB > tracking.max_model_mb="
                    f"{limit:g}; the model is in {export.out_dir}"
                },
            )
            return
        artifact = Path(export.artifact)
        for f in sorted(artifact.parent.glob(artifact.name + "*")):  # model.onnx, model.onnx.data
            self.tracker.artifact(o.run_id, f, "model")

    def bench_spec(self, pv: PlannedVariant, export: ExportResult) -> BenchSpec:
        v = pv.variant
        return BenchSpec(
            variant=pv.name,
            backend=v.backend.name,
            device=v.device.name,
            model=v.model,
            phase=v.phase,
            export_dir=export.out_dir,
            out_dir=str(self.out_dir / pv.name),
            bench=v.bench,
            backend_options=dict(v.backend.options),
            peak_bandwidth_gbs=v.device.peak_bandwidth_gbs,
        )

    # -- benchmark --------------------------------------------------------------------
    def on_bench(self, name: str, result: BenchResult | Failure) -> None:
        o = self.outcomes[name]
        if isinstance(result, Failure):
            self.fail(o, result)
            return
        o.metrics.update(result.metrics)
        cv_threshold = self.variants[name].variant.bench.cv_threshold
        o.unstable = result.ok and result.metrics.get("latency_cv", 0.0) > cv_threshold
        metrics = dict(result.metrics, unstable=float(o.unstable))
        self.tracker.log(
            o.run_id,
            metrics=metrics,
            params={f"runtime.{k}": v for k, v in result.params.items()},
            tags={f"env.{k}": v for k, v in result.env.items()},
        )
        if result.parity:
            self.tracker.log_dict(o.run_id, result.parity, "parity.json")
        for path in result.files.values():
            self.tracker.artifact(o.run_id, path)
        if not result.ok:
            self.fail(o, result.failure)
            return
        o.status = "ok"
        self.tracker.log(o.run_id, tags={"status": "ok", "unstable": o.unstable, "parity": "passed"})
        self.tracker.end(o.run_id, "FINISHED")
        say(
            f"  measured  {name:<44} {o.metrics['latency_ms_median']:8.3f} ms median, parity "
            f"{o.metrics['parity_max_abs_diff']:.1e}{'  UNSTABLE' if o.unstable else ''}"
        )

    def fail(self, o: Outcome, failure: Failure) -> None:
        o.status, o.stage, o.error = "failed", failure.stage, failure.error
        self.tracker.log_failure(o.run_id, failure.stage, failure.error, failure.traceback)
        if failure.stage == "parity":
            self.tracker.log(o.run_id, tags={"parity": "failed"})
        self.tracker.end(o.run_id, "FAILED")
        say(f"  FAILED    {o.name:<44} {failure.stage}: {failure.error}")

    def abort(self, why: str) -> None:
        """Ctrl-C or a driver error: close every open run with the reason, lose nothing logged."""
        for o in self.outcomes.values():
            if not o.ended and o.run_id:
                self.tracker.log(o.run_id, tags={"status": "aborted", "error": why})
                self.tracker.end(o.run_id, "KILLED")
                o.status, o.error = "aborted", why
        if getattr(self, "parent", None):
            self.tracker.log(self.parent, tags={"status": "aborted", "error": why})
            self.tracker.end(self.parent, "KILLED")

    # -- end ------------------------------------------------------------------------------
    def finish(self, seconds: float) -> str:
        outs = list(self.outcomes.values())
        counts = {s: sum(o.status == s for o in outs) for s in ("ok", "failed", "skipped")}
        rows = summary_rows(outs)
        text = table(rows)
        self.tracker.log(
            self.parent,
            metrics={f"variants_{k}": v for k, v in counts.items()} | {"sweep_seconds": seconds},
            tags={"status": "failed" if counts["failed"] else "ok"},
        )
        self.tracker.log_text(self.parent, text + "\n", "summary.txt")
        self.tracker.log_dict(self.parent, rows, "summary.json")
        plot = self.out_dir / "latency.png"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if latency_plot(outs, str(plot)):
            self.tracker.artifact(self.parent, plot)
        self.tracker.end(self.parent, "FAILED" if counts["failed"] else "FINISHED")
        return text


def run_sweep(configs: list[DictConfig], overrides: list[list[str]], out_dir: Path, command: str) -> dict[int, Outcome]:
    """Plan every config, run the exports and benchmarks, record them; returns each Hydra
    job's outcome by job index. Bad configs raise ConfigError before anything starts."""
    t0 = time.perf_counter()
    plan = make_plan(configs, overrides)
    say(f"phasesweep: {len(plan.variants)} variant(s), {len(plan.exports)} export(s), {len(plan.skipped)} skipped")
    for s in plan.skipped:
        say(f"  skipped   {s.name}: {s.reason}")
    tracker = Tracker(plan.point.tracking)
    with Scheduler(plan.point.cluster) as sched:
        for pv in plan.variants:  # resolve "all cores" once the cluster is known
            threads = sched.bench_threads(pv.variant.device.name, pv.variant.bench.threads)
            pv.variant = replace(pv.variant, bench=replace(pv.variant.bench, threads=threads))
            # the Ray resources of its benchmark; a request no node can meet is a ConfigError now
            pv.resources = sched.bench_options(
                pv.variant.device.name, threads, pv.variant.device.resources, pv.variant.weight_bytes
            )
        run = SweepRun(plan, out_dir, tracker, sched)
        run.record_plan(command)
        try:
            run.fail_unplaceable()
            for key, spec in run.exports_needed().items():
                sched.submit_export(key, spec, plan.by_export(key)[0].variant.weight_bytes)
            for kind, key, result in sched.results():
                (run.on_export if kind == "export" else run.on_bench)(key, result)
        except BaseException as e:
            run.abort(f"{type(e).__name__}: {e}")
            raise
    text = run.finish(time.perf_counter() - t0)
    say("\n" + text)
    say(f"\nBrowse the runs:  {ui_command(tracker.uri)}")
    by_job: dict[int, Outcome] = {}
    for pv in plan.variants:
        for j in pv.jobs:
            by_job[j] = run.outcomes[pv.name]
    for s in plan.skipped:
        by_job[s.job] = run.outcomes[f"{s.name} (job #{s.job})"]
    return by_job
