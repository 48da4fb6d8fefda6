"""The whole-generation view (orchestrator/read/generation.py): its arithmetic on synthetic
series, its block in the sweep's summary and on the sweep's run, its plot, and a captured
application's measured loop beside it (orchestrator/read/generation_app.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from orchestrator.common.outcome import Outcome, Status
from orchestrator.read.generation import generation_text, generations, interpolate, percentile, predict, step_times
from orchestrator.read.generation_app import AppLoop, Basis, app_rows, rhythms
from orchestrator.read.generation_plot import generation_plot
from orchestrator.read.plots import GENERATION, make_plots, plot_rows


def test_interpolation_is_linear_between_depths_and_flat_beyond():
    pts = [(128, 1.0), (512, 3.0), (1024, 4.0)]
    assert interpolate(pts, 320) == pytest.approx(2.0)
    assert interpolate(pts, 768) == pytest.approx(3.5)
    assert interpolate(pts, 512) == 3.0
    assert interpolate(pts, 64) == 1.0 and interpolate(pts, 4096) == 4.0


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_is_numpys_linear_one(q):
    values = list(np.random.default_rng(0).gamma(2.0, 1.0, 37))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_a_generation_steps_once_per_token_after_the_first_at_depths_p_onwards():
    """N tokens: the first is the prefill's; N-1 decode steps at depths P .. P+N-2."""
    pts = [(100, 1.0), (200, 2.0)]  # 1 ms at depth 100, +0.01 ms a position
    steps = step_times(pts, 100, 101)
    assert len(steps) == 100 and steps[0] == 1.0 and steps[-1] == pytest.approx(1.99)
    got = predict(10.0, pts, 100, 101, batch=2)
    assert got["ttft_ms"] == 10.0
    assert got["tpot_ms_mean"] == pytest.approx(1.495)
    assert got["tpot_ms_p90"] == pytest.approx(float(np.percentile(steps, 90)))
    assert got["e2e_ms"] == pytest.approx(10.0 + 149.5)
    assert got["tokens_per_s"] == pytest.approx(2 * 101 / 159.5 * 1e3)
    assert predict(10.0, pts, 100, 1)["e2e_ms"] == 10.0  # one token: the prefill alone
    with pytest.raises(ValueError, match="new_tokens"):
        predict(10.0, pts, 100, 0)


def outcome(name: str, phase: str, backend: str, median: float, series: list[tuple[int, float]] = ()) -> Outcome:
    o = Outcome(name, Status.OK, axes={"model": "llama", "phase": phase, "backend": backend, "device": "cpu"})
    o.metrics = {"latency_ms_median": median}
    o.series = {"depth_latency_ms_median": list(series)} if series else {}
    return o


def sweep_rows() -> list[dict]:
    """prefill P=128 and decode depths 128..1024 on two backends (one decode with a depth series,
    the other measured as separate variants at two contexts), one failed, one lone decode."""
    outs = [
        outcome("llama_prefill_onnxruntime_cpu", "prefill", "onnxruntime", 5.0),
        outcome("llama_decode_onnxruntime_cpu", "decode", "onnxruntime", 1.0, [(128, 1.0), (512, 1.5), (1024, 2.0)]),
        outcome("llama_prefill_executorch_cpu", "prefill", "executorch", 4.0),
        outcome("llama_decode_executorch_cpu_ctx128", "decode", "executorch", 1.2),
        outcome("llama_decode_executorch_cpu_ctx1024", "decode", "executorch", 1.4),
        outcome("llama_decode_eager_cpu", "decode", "eager", 3.0),  # no prefill beside it: no generation
    ]
    failed = replace(outcome("llama_prefill_compile_cpu", "prefill", "compile", 1.0), status=Status.FAILED)
    params = {o.name: {"phase.batch": 1, "phase.prompt_len": 128 if o.axes["phase"] == "prefill" else None} for o in outs}
    for o in outs:
        if "_ctx" in o.name:
            params[o.name]["phase.context_len"] = int(o.name.rsplit("ctx", 1)[1])
    params["llama_decode_onnxruntime_cpu"]["phase.context_len"] = 128
    params["llama_decode_eager_cpu"]["phase.context_len"] = 128
    return plot_rows([*outs, failed], params)


def test_each_prefill_meets_its_backends_decode_and_the_summary_says_so():
    gens = {g.backend: g for g in generations(sweep_rows())}
    assert set(gens) == {"onnxruntime", "executorch"}
    ort, et = gens["onnxruntime"], gens["executorch"]
    assert ort.prompt == et.prompt == 128 and ort.new_tokens == et.new_tokens == 1024 - 128 + 2
    assert ort.depths == (128, 512, 1024) and et.depths == (128, 1024)
    assert et.decode == ("llama_decode_executorch_cpu_ctx1024", "llama_decode_executorch_cpu_ctx128")
    assert ort.ttft_ms == 5.0 and et.tpot_ms_mean == pytest.approx(1.3)  # linear 1.2 -> 1.4 over the steps
    assert ort.tpot_ms_p90 > ort.tpot_ms_mean and not ort.extrapolated
    text = generation_text(list(gens.values()))
    assert text.startswith("Whole generation, predicted") and "B1 P128 N898" in text
    assert generation_text([]) == ""


def test_a_decode_shallower_than_the_prompt_makes_no_generation():
    rows = [r for r in sweep_rows() if r["backend"] == "executorch"]
    rows[0]["params"]["phase.prompt_len"] = "2048"  # as MLflow reads params back: text
    assert generations(rows) == []


def test_one_decode_depth_is_a_point_not_a_generation():
    """The default sweep (prefill P=128, decode at 128) prints no two-token 'generation'."""
    rows = [r for r in sweep_rows() if r["backend"] == "executorch" and not r["name"].endswith("ctx1024")]
    assert len(rows) == 2 and generations(rows) == []


def test_the_plot_draws_ttft_and_tpot_bars_only_when_there_is_a_generation(tmp_path):
    rows = sweep_rows()
    drawn = make_plots(rows, tmp_path)
    assert tmp_path / GENERATION in drawn and (tmp_path / GENERATION).stat().st_size > 10_000
    assert not generation_plot([r for r in rows if r["phase"] == "decode"], tmp_path / "none.png")


def test_a_captured_application_is_compared_on_each_runtime_with_its_own_time_outside_the_forward():
    gens = generations(sweep_rows())
    on_transformers = {"app_ttft_ms": 7.0, "app_inter_token_ms_mean": 2.5, "app_prefill_forward_ms_median": 5.5, "app_decode_forward_ms_mean": 1.2,
                       "app_calls": 898.0}
    loop = AppLoop.of("llama", {"llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu"}, on_transformers)
    ort = next(g for g in gens if g.backend == "onnxruntime")
    on_ort = {"app_ttft_ms": 6.6, "app_inter_token_ms_mean": 2.9, "app_prefill_forward_ms_median": 5.1, "app_decode_forward_ms_mean": 1.2}
    rows = {r["figure"]: r for r in app_rows(gens, [loop], {ort.prefill: on_ort})}  # the capture's variants only
    assert set(rows) == {"TTFT", "TPOT mean", "prefill call, back to back", "decode call mean, back to back"}
    assert rows["TTFT"]["predicted_ms"] == pytest.approx(5.0 + 1.5)  # no runtime calls timed apart: the app's 1.5 ms on transformers
    assert rows["TTFT"]["ratio"] == pytest.approx(6.5 / 6.6, abs=1e-3) and rows["TTFT"]["verdict"] == "within 10%"
    assert rows["TPOT mean"]["predicted_ms"] == pytest.approx(ort.tpot_ms_mean + 1.3, abs=1e-4)
    assert rows["prefill call, back to back"]["app_measured_ms"] == 5.1 and rows["TTFT"]["app_ran_on"] == "onnxruntime cpu"
    assert rows["decode call mean, back to back"]["verdict"] == f"{ort.tpot_ms_mean / 1.2 - 1:+.0%}" != "within 10%"
    assert "decode hot" not in rows  # no back-to-back calls timed after the loop
    hot = {**on_ort, "hot_prefill_forward_ms_median": 5.2, "hot_decode_forward_ms_median": 2.1}
    rows = {r["figure"]: r for r in app_rows(gens, [loop], {ort.prefill: hot})}
    assert rows["decode hot"]["predicted_ms"] == 2.0 and rows["decode hot"]["app_measured_ms"] == 2.1  # at depth P+N-2 = 1024
    assert rows["prefill hot"]["ratio"] == pytest.approx(5.0 / 5.2, abs=1e-3)
    fallback = {r["figure"]: r for r in app_rows(gens, [loop], {})}  # no run on the runtime: against transformers, said so
    assert fallback["TTFT"]["app_measured_ms"] == 7.0 and fallback["TTFT"]["app_ran_on"].startswith("transformers")
    assert AppLoop.of("llama", set(), {"app_ttft_ms": 7.0}) is None  # no decode timed: nothing to compare
    short = AppLoop.of("llama", {ort.prefill}, {**on_transformers, "app_calls": 2.0})  # predicted for the application's own N
    rows = {r["figure"]: r for r in app_rows(gens, [short], {ort.prefill: on_ort})}
    assert rows["decode call mean, back to back"]["predicted_ms"] == 1.0 and rows["TTFT"]["generation"] == "P128 N2"
    long = AppLoop.of("llama", {ort.prefill}, {**on_transformers, "app_calls": 2000.0})
    assert app_rows(gens, [long], {})[0]["generation"] == "P128 N2000 (deeper than measured: held flat)"


def rhythm_rows() -> list[dict]:
    """sweep_rows() with ONNX Runtime's prompt and decode timed in rhythm: each call slower the
    longer the gap before it (gap us -> ms), the steps' mean above their median (slow calls)."""
    rows = sweep_rows()
    for r in rows:
        if r["name"] == "llama_prefill_onnxruntime_cpu":
            r["series"] |= {"rhythm_by_gap_ms_median": [(100, 5.0), (1000, 6.0), (3000, 7.0)], "rhythm_by_gap_ms_mean": [(100, 9.0), (3000, 9.0)]}
        if r["name"] == "llama_decode_onnxruntime_cpu":
            r["series"] |= {"rhythm_by_gap_ms_median": [(100, 1.0), (3000, 1.0)], "rhythm_by_gap_ms_mean": [(100, 1.0), (1000, 1.5), (3000, 3.5)]}
    return rows


def test_the_runtimes_calls_are_predicted_in_the_applications_rhythm_at_its_own_gap_on_that_runtime():
    """The prompt's median and the steps' mean, read at the gaps the application left between the
    runtime's calls on that runtime (its time outside them), plus that time: the prediction."""
    rows = rhythm_rows()
    gens = generations(rows)
    ort = next(g for g in gens if g.backend == "onnxruntime")
    loop = AppLoop.of("llama", {ort.prefill, *ort.decode}, {"app_ttft_ms": 9.0, "app_inter_token_ms_mean": 3.0,
                      "app_prefill_forward_ms_median": 8.0, "app_decode_forward_ms_mean": 2.9, "app_calls": 898.0})  # fmt: skip
    on_ort = {"app_ttft_ms": 8.0, "app_inter_token_ms_mean": 3.0, "app_prefill_forward_ms_median": 7.8, "app_decode_forward_ms_mean": 2.5,
              "app_prefill_call_ms_median": 6.0, "app_decode_call_ms_mean": 2.0}  # 2 ms outside the prompt's call, 1 ms per step
    got = {r["figure"]: r for r in app_rows(gens, [loop], {ort.prefill: on_ort}, rhythms(rows))}
    assert got["prefill call, in rhythm"]["predicted_ms"] == pytest.approx(6.5)  # the median series at 2000 us
    assert got["prefill call, in rhythm"]["app_measured_ms"] == 6.0
    assert got["decode call mean, in rhythm"]["predicted_ms"] == pytest.approx(1.5)  # the mean series at 1000 us, every depth
    assert got["TTFT"]["predicted_ms"] == pytest.approx(6.5 + 2.0) and got["TTFT"]["app_measured_ms"] == 8.0
    assert got["TPOT mean"]["predicted_ms"] == pytest.approx(1.5 + 1.0) and got["TPOT mean"]["verdict"] == "-17%"
    assert got["outside, to 1st token"]["predicted_ms"] == pytest.approx(1.0) and got["outside, to 1st token"]["app_measured_ms"] == 2.0
    assert got["outside, per step"]["predicted_ms"] == pytest.approx(0.1) and got["outside, per step"]["app_measured_ms"] == 1.0
    et = next(g for g in gens if g.backend == "executorch")  # no rhythm timed: back to back, and the rows say so
    assert Basis.of(et, rhythms(rows), 2.0, 1.0) == Basis(et.ttft_ms, et.points, False)
    assert rhythms(rows)["llama_decode_onnxruntime_cpu"].depth == 128 and rhythms(rows)["llama_prefill_onnxruntime_cpu"].depth is None


def captured_plan(kept_contexts: tuple[int, ...]):
    """A captured plan of the bundled application (its capture's result given; the capture
    itself: test_capture.py): its prompt and decode calls at these contexts kept."""
    from orchestrator.plan.config import validate_all
    from orchestrator.plan.planner import make_plan
    from tasks.specs import PhaseSpec
    from tests.conftest import CaptureRunner, capacity, compose_jobs

    app = "examples.generate_app:run"
    configs, overrides = compose_jobs(["phase=captured", f"phase.app={app}"], shrink=False)
    points = validate_all(configs, overrides)
    kept = [PhaseSpec("captured", 1, prompt_len=128, parity_steps=1, app=app, kind="prefill", call=0, inputs="p.npz")]
    kept += [PhaseSpec("captured", 1, context_len=c, app=app, kind="decode", call=c - 127, inputs=f"d{c}.npz") for c in kept_contexts]
    timings = {"app_runs": 3.0, "app_outside_forward_share": 0.2, "app_ttft_ms": 5.0, "app_inter_token_ms_mean": 2.0, "app_prefill_forward_ms_median": 4.0, "app_decode_forward_ms_mean": 1.5, "app_calls": 300.0}
    runner = CaptureRunner(total_calls=300, kept=kept, timings=timings)
    plan = make_plan(points, configs, overrides, capacity(), runner=runner)
    (spec,) = runner.specs.values()
    return plan, spec


def test_a_captured_sweep_prints_and_logs_its_generation_beside_the_applications_loop(tmp_path):
    """Every kept call measured: the application runs again on the runtime; the summary has the
    generation block and the comparison, the sweep's run generation.json, its table,
    captures/generation_vs_app.json and the bars."""
    from orchestrator.run.sweep_run import SweepRun
    from tasks.specs import AppLoopResult
    from tests.test_sweep_run import FakeScheduler, FakeTracker, bench_ok, export_ok

    plan, capture = captured_plan((128, 426))
    gaps = {pv.variant.phase.kind: pv.bench.rhythm_gap_ms for pv in plan.variants}  # timed in the application's rhythm
    assert gaps == {"prefill": 1.0, "decode": None}  # its TTFT less its prefill; no loop timed at the decode calls
    tracker = FakeTracker()
    sched = FakeScheduler()
    run = SweepRun(plan, tmp_path, tracker, sched)
    run.record_plan("cmd")
    run.start()
    for pv in plan.variants:
        assert not [s for s in sched.submitted if s[0] == "apploop"]  # not before every kept call is measured
        run.on_export(pv.export_key, export_ok(pv.export_key, tmp_path / pv.name))
        run.on_bench(f"{pv.name}#0", bench_ok(pv.name))
    (loop,) = [s for s in sched.submitted if s[0] == "apploop"]  # the application, again on the runtime
    prompt = plan.variants[0]
    assert loop[1] == prompt.name and loop[2].prefill == prompt.bench and loop[2].decode.phase.context_len == 426
    assert loop[2].capture == capture
    on_runtime = {"app_ttft_ms": 4.0, "app_inter_token_ms_mean": 1.8, "app_prefill_forward_ms_median": 1.1, "app_decode_forward_ms_mean": 1.0}
    run.on_result("apploop", prompt.name, AppLoopResult(prompt.name, True, timings=on_runtime, tokens_agree=1.0))
    text = run.finish(1.0)
    parent = tracker.parent()
    (gen,) = parent.files["generation.json"]
    assert (gen["prompt"], gen["new_tokens"], gen["backend"]) == (128, 300, "onnxruntime")
    assert gen["ttft_ms"] == pytest.approx(1.003) and len(parent.files["generation_table.json"]) == 1  # bench_ok's median
    compared = {r["figure"]: r for r in parent.files["captures/generation_vs_app.json"]}
    assert compared["TTFT"]["app_measured_ms"] == 4.0 and compared["decode call mean, back to back"]["app_measured_ms"] == 1.0
    assert compared["TTFT"]["predicted_ms"] == pytest.approx(1.003 + 1.0)  # + the app's 1 ms outside its prefill on transformers
    assert "Whole generation, predicted" in text and "the application run on each runtime" in text
    assert ("generation_ttft_tpot.png", "plots") in parent.artifacts




def test_an_application_that_would_outgrow_its_static_export_is_not_run_on_the_runtime():
    """Its deepest kept decode holds 136 slots, its loop reaches 427: not run (compared with
    transformers instead); a growing cache would hold it."""
    from orchestrator.run.app_loops import ready

    plan, _ = captured_plan((128,))
    done = {pv.name: Outcome(pv.name, Status.OK) for pv in plan.variants}
    assert plan.variants[1].variant.phase.cache_len == 136 and ready(plan, plan.variants[0].name, done) == []


@pytest.mark.slow
def test_the_captured_application_runs_on_onnxruntime_beside_its_predicted_generation(tmp_path, mlflow_db, cache_override):
    """The bundled application captured, its calls measured on ONNX Runtime (a growing cache),
    then run again with its forward answered by the runtime: its 300 tokens as on transformers,
    and every figure of the comparison measured on the runtime."""
    import json
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    from orchestrator.run.sweep import run_sweep
    from tests.conftest import compose_jobs

    uri = mlflow_db(tmp_path)
    job = ["phase=captured", "phase.app=examples.generate_app:run", "phase.capture.max_variants=2", "phase.capture.timed_runs=2",
           "model.kv_cache=dynamic", "bench.min_seconds=0.3", "bench.max_seconds=1", cache_override, f"tracking.uri={uri}",
           f"tracking.artifact_root={tmp_path / 'mlartifacts'}"]  # fmt: skip
    configs, overrides = compose_jobs(job, shrink=False)
    outcomes = run_sweep(configs, overrides, tmp_path / "out", "pytest: generation")
    assert {o.status for o in outcomes.values()} == {"ok"}
    client = MlflowClient(tracking_uri=uri)
    (parent,) = [r for r in client.search_runs([client.get_experiment_by_name("phasesweep").experiment_id])
                 if r.data.tags.get("phasesweep.role") == "sweep"]  # fmt: skip

    def artifact(name: str):
        return json.loads(Path(client.download_artifacts(parent.info.run_id, name, str(tmp_path))).read_text())

    (gen,) = artifact("generation.json")
    assert (gen["prompt"], gen["new_tokens"], gen["depths"]) == (128, 300, [128, 426])  # the application's own generation
    rows = {r["figure"]: r for r in artifact("captures/generation_vs_app.json")}
    assert set(rows) == {"TTFT", "TPOT mean", "prefill call, in rhythm", "decode call mean, in rhythm", "outside, to 1st token",
                         "outside, per step", "prefill hot", "decode hot"}  # fmt: skip
    assert {r["app_ran_on"] for r in rows.values()} == {"onnxruntime cpu"}
    assert {r["tokens_as_on_transformers"] for r in rows.values()} == {"100%"}  # greedy, within parity: the same tokens
    assert all(r["predicted_ms"] > 0 and r["app_measured_ms"] > 0 for r in rows.values())
    summary = client.download_artifacts(parent.info.run_id, "summary.txt", str(tmp_path))
    assert "the application run on each runtime" in Path(summary).read_text()
    from orchestrator.read.report_build import report

    page = report(uri, parent.info.run_id, "markdown", tmp_path / "report.md")  # rebuilt from the store alone
    assert "Whole generation, predicted" in page and "the application run on each runtime" in page
    assert (tmp_path / "report_plots" / "plots" / "generation_ttft_tpot.png").is_file()


def test_the_loops_call_span_holds_the_runtimes_call_alone_not_the_handing_over_of_its_inputs():
    """A step's binding and output copies are the application's own time: the span the loop
    records is the call a benchmark times, so a slow hand-over cannot land in it."""
    import time

    from tasks.app_loop import RuntimeForward
    from tasks.measure.session import Session, Staged

    class SlowHandOver(Session):
        def staged(self, inputs):
            time.sleep(0.05)  # binding
            return Staged(lambda: None, lambda: (time.sleep(0.05), ["logits"])[1])  # copies out after the call

    forward = RuntimeForward.__new__(RuntimeForward)
    forward.spans = []
    assert forward._timed(SlowHandOver(), {}, True) == ["logits"]
    ((ns, filled),) = forward.spans
    assert filled and ns < 0.02e9
