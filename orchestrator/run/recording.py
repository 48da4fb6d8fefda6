"""What a sweep writes to the tracking store beyond run states: an export's and a benchmark's
figures and artifacts, the model, and the sweep's summary, plots and note."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.common.console import table
from orchestrator.common.outcome import Outcome
from orchestrator.plan.planner import Plan
from orchestrator.plan.variant import Variant
from orchestrator.read.curves import curves_text
from orchestrator.read.generation import ARTIFACT as GENERATION
from orchestrator.read.generation import TABLE as GENERATION_TABLE
from orchestrator.read.generation import generation_record, generation_rows, generation_text, generations
from orchestrator.read.generation_app import ARTIFACT as GENERATION_VS_APP
from orchestrator.read.generation_app import AppLoop, app_rows, app_text, rhythms
from orchestrator.read.plots import make_plots, plot_rows, profile_plot
from orchestrator.read.stats import compare_paired
from orchestrator.read.summary import sweep_note
from orchestrator.record.tracking import Tracker
from tasks.measure import anatomy
from tasks.measure.profiles import CHART, TABLE
from tasks.specs import BenchResult, ExportResult, Failure


def config_yaml(cfg: DictConfig, revision: str | None = None) -> str:
    """The variant's config as it ran; a Hugging Face id's `revision`: the commit the sweep
    resolved, so a rebuild from it (compare --remeasure) loads the same weights."""
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    text = OmegaConf.to_yaml(cfg, resolve=True)
    if revision is None:
        return text
    pinned = OmegaConf.create(text)
    pinned.model.revision = revision
    return OmegaConf.to_yaml(pinned)


def axes(v: Variant) -> dict[str, str]:
    return {"model": v.model.name, "phase": v.phase.label, "backend": v.backend.name, "device": v.device.name}


def log_export(tracker: Tracker, run_id: str, result: ExportResult, tags: dict[str, Any]) -> None:
    """An export's figures on a variant's run; what is inside the artifact, when known."""
    headline = anatomy.headline(result.anatomy) if result.anatomy else {}
    metrics = {"export_seconds": result.export_seconds, "artifact_mb": result.artifact_mb, **headline}
    params = {f"shape.{n}": s for n, s in result.input_shapes.items()} | {f"export.{k}": v for k, v in result.details.items()}
    tags = {"export_cache_hit": result.cache_hit, "export_dir": result.out_dir, **tags}  # on the node that made it
    tracker.log(run_id, metrics=metrics, params=params, tags=tags)
    if result.anatomy:
        tracker.log_dict(run_id, result.anatomy, anatomy.ARTIFACT)
        tracker.log_table(run_id, anatomy.rows(result.anatomy), anatomy.TABLE)


def log_model(
    tracker: Tracker, parent: str, export: ExportResult, planned: str, folder: Callable[[], Path], limit: float | None
) -> dict[str, str]:
    """The exported model (and its external weights, from `folder()` on this machine), stored once
    on the sweep's run under exports/<entry>/; returns the tags telling each variant where it is,
    or, larger than tracking.max_model_mb, where it stayed."""
    if limit is not None and export.artifact_mb > limit:
        why = f"{export.artifact_mb:.0f} MB > tracking.max_model_mb={limit:g}; the model is in {export.out_dir}"
        return {"model_not_logged": why}
    name = Path(export.artifact).name
    where = f"exports/{Path(planned).name}"
    for f in sorted(folder().glob(name + "*")):  # model.onnx, model.onnx.data: linked where the store allows
        tracker.artifact(parent, f, where, link=True)
    return {"model_artifact": f"{tracker.artifact_uri(parent)}/{where}/{name}"}


def log_bench(tracker: Tracker, name: str, run_id: str, result: BenchResult) -> None:
    """A variant's pooled benchmark: figures, parity, every latency sample."""
    params, tags = {f"runtime.{k}": v for k, v in result.params.items()}, {f"env.{k}": v for k, v in result.env.items()}
    tracker.log(run_id, metrics=result.metrics, params=params, tags=tags, series=result.series)
    if result.parity:
        tracker.log_dict(run_id, result.parity, "parity.json")
    if result.samples_ns:
        samples = {"variant": name, "unit": "ns", "first_call_ns": result.first_call_ns, "samples": result.samples_ns}
        tracker.log_dict(run_id, samples, "latency_samples.json", indent=None)


def log_profile(tracker: Tracker, o: Outcome, rows: list[dict[str, Any]], out_dir: Path) -> None:
    """bench.profile's top ops, as a table and a chart."""
    tracker.log_table(o.run_id, rows, TABLE)
    folder = out_dir / "profiles" / o.name
    folder.mkdir(parents=True, exist_ok=True)
    if profile_plot(rows, o.name, folder / CHART):
        tracker.artifact(o.run_id, folder / CHART)


def log_pair(tracker: Tracker, a: Outcome, b: Outcome, result: Any) -> dict[str, str]:
    """A/B pair's interleaved timing (tasks/paired.py) on the candidate's run; its summary row."""
    row = {"baseline": a.name, "candidate": b.name}
    if isinstance(result, Failure) or not result.ok:
        failure = result if isinstance(result, Failure) else result.failure
        tracker.log(b.run_id, tags={"pair_baseline": a.name, "pair_error": failure.error})
        return row | {"ratio": "-", "ratio_95ci": "-", "verdict": f"not timed: {failure.error}"}
    r = compare_paired(asdict(result) | {"samples_ns": {"baseline": [], "candidate": []}})
    tracker.log(
        b.run_id,
        metrics={"pair_ratio": r["ratio"], "pair_ratio_ci_low": r["ratio_ci_low"], "pair_ratio_ci_high": r["ratio_ci_high"],
                 "pair_rounds": r["rounds"], "pair_p_value": r["p_value"]},
        tags={"pair_baseline": a.name, "pair_verdict": r["verdict"]},
    )
    tracker.log_dict(b.run_id, {k: v for k, v in asdict(result).items() if k != "samples_ns"}, "pair.json")
    return row | {
        "ratio": f"{r['ratio']:.3f}",
        "ratio_95ci": f"[{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}]",
        "rounds": str(r["rounds"]),
        "verdict": r["verdict"],
    }


def log_summary(
    tracker: Tracker, parent: str, plan: Plan, outcomes: dict[str, Outcome], rows: list[dict], out_dir: Path,
    pairs: list[dict[str, str]] | None = None, plots: bool = True, notes: list[str] | None = None,
    on_runtime: dict[str, dict[str, float]] | None = None, command: str | None = None,
) -> str:
    """The sweep's summary (text, JSON, an MLflow table and the run's note) and, with `plots`,
    its plots; returns the text. `notes`: lines below the table (the code measured, alerts);
    `on_runtime`: a captured application's timings on each runtime, by its prompt variant;
    `command`: the sweep's, at the head of the note."""
    text = table(rows) + ("\n\n" + "\n".join(notes) if notes else "")
    if pairs:  # hydra.launcher.pair: each pair timed interleaved
        tracker.log_dict(parent, pairs, "pairs.json")
        text += "\n\nA/B pairs, timed interleaved (ratio = candidate / baseline median; sign test, min effect 5%)\n" + table(pairs)
    if plan.captures:  # the captured phases' benchmarks beside the application's own loop
        phases = {pv.name: pv.variant.phase for pv in plan.variants}
        beside = plan.captures.beside(outcomes, phases)
        if beside:
            tracker.log_dict(parent, beside, "captures/benchmark_vs_app.json")
            text += (
                "\n\nCaptured phases: each benchmark's median beside the application's own loop at that call "
                "(its eager forward there; the time from one token to the next)\n" + table(beside)
            )
    params = {pv.name: pv.variant.params for pv in plan.variants}
    params.update({s.name: s.variant.params for s in plan.skipped})
    if curves := curves_text(list(outcomes.values()), params):  # depth series, batch sweeps and their knees
        text += "\n\n" + curves
    if generated := log_generation(tracker, parent, plan, plot_rows(list(outcomes.values()), params), on_runtime or {}):
        text += "\n\n" + generated
    tracker.log_text(parent, text + "\n", "summary.txt")
    tracker.log_dict(parent, rows, "summary.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = make_plots(plot_rows(list(outcomes.values()), params), out_dir) if plots else []
    for plot in drawn:  # latency.png at the root
        folder = plot.parent.relative_to(out_dir).as_posix()
        tracker.artifact(parent, plot, None if folder == "." else folder)
    shown = tuple(plot.relative_to(out_dir).as_posix() for plot in drawn)
    tracker.log(parent, tags={"mlflow.note.content": sweep_note(command, rows, plots=shown, run_id=parent)})
    if rows:
        tracker.log_table(parent, rows, "summary_table.json")
    return text


def app_loops(plan: Plan) -> list[AppLoop]:
    """Each captured application's own measured loop, with the variants of its kept calls."""
    if not plan.captures:
        return []
    phases = {pv.name: pv.variant.phase for pv in plan.variants}
    loops = []
    for key, result in plan.captures.results.items():
        inputs = {p.inputs for p in result.kept}
        loop = AppLoop.of(plan.captures.labels[key], {n for n, ph in phases.items() if ph.inputs in inputs}, result.timings)
        if loop is not None:
            loops.append(loop)
    return loops


def log_generation(tracker: Tracker, parent: str, plan: Plan, rows: list[dict[str, Any]], on_runtime: dict[str, dict[str, float]]) -> str:
    """The predicted whole generations (orchestrator/read/generation.py, from the plots' `rows`)
    on the sweep's run, and for a captured application the prediction beside its measured loop;
    their text, or ''."""
    gens = generations(rows)
    if not gens:
        return ""
    tracker.log_dict(parent, generation_record(gens), GENERATION)
    tracker.log_table(parent, generation_rows(gens), GENERATION_TABLE)
    text = generation_text(gens)
    if compared := app_rows(gens, app_loops(plan), on_runtime, rhythms(rows)):
        tracker.log_dict(parent, compared, GENERATION_VS_APP)
        text += "\n\n" + app_text(compared)
    return text
