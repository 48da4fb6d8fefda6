"""phase=captured: an application's forward calls recorded, grouped, capped and replayed.

- the selection and the config's checks, pure;
- the capture job on the bundled example (128-token prompt, 300 new tokens) and on
  applications that raise, never call the model, or call it in ways no graph represents;
- a kept call's data is the application's own (the reference's logits equal what the
  application saw) and exports and benchmarks with parity;
- a sweep (slow): the example captured beside a synthetic decode of the same shape, the
  application's figures on the sweep's run, the two decodes agreeing within the compare's
  noise verdict; a failing application ends the sweep before any run exists.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.jobs import bench_job, export_job
from tasks.model.models import build_model, model_dims
from tasks.phases import captured, phase_module
from tasks.phases._calls import distinct_calls, select
from tasks.specs import BenchSpec, CaptureOptions, CaptureSpec, ConfigError, ExportSpec, PhaseSpec
from tests import capture_apps
from tests.conftest import FAST_BENCH, ROOT, compose_jobs, model_spec

EXAMPLE = "examples.generate_app:run"


# -- pure ---------------------------------------------------------------------------------


def _decodes(contexts):
    return [{"call": i + 1, "kind": "decode", "batch": 1, "new_tokens": 1, "context": c} for i, c in enumerate(contexts)]


@pytest.mark.parametrize(
    "rule,want",
    [("spread", [100, 133, 166, 199]), ("first", [100, 101, 102, 103]), ("longest", [196, 197, 198, 199])],
)
def test_select_keeps_n_of_a_kind(rule, want):
    calls = _decodes(range(100, 200))
    assert [c["context"] for c in select(calls, 4, rule)] == want
    assert select(calls[:3], 4, rule) == calls[:3]  # fewer than asked: all of them
    assert [c["context"] for c in select(calls, 1, "spread")] == [100]


def test_distinct_calls_count_repeats():
    calls = _decodes([5, 6, 5, 5])
    out = distinct_calls(calls)
    assert [(c["context"], c["count"], c["call"]) for c in out] == [(5, 3, 1), (6, 1, 2)]


@pytest.mark.parametrize(
    "phase,message",
    [
        (PhaseSpec("captured", 1), "phase=captured needs phase.app=package.module:function"),
        (PhaseSpec("captured", 1, app="examples.generate_app"), "must name a function as package.module:function"),
        (PhaseSpec("captured", 1, app="a:b", capture=CaptureOptions(select="best")), "phase.capture.select='best'"),
        (PhaseSpec("captured", 1, app="a:b", capture=CaptureOptions(max_variants=0)), "max_variants=0 must be >= 1"),
        (PhaseSpec("decode", 1, context_len=8, app="a:b"), "phase.app='a:b' is for phase=captured"),
    ],
)
def test_the_config_is_checked_before_any_work(phase, message):
    module = phase_module(phase.name)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        module.check(module.normalize(phase, "static"))


def test_a_kept_call_reads_as_its_kind_and_normalises_as_it():
    kept = PhaseSpec("captured", 1, context_len=40, app=EXAMPLE, kind="decode", call=3, inputs="x.npz")
    spec = captured.normalize(kept, "static")
    assert spec.label == "decode" and spec.cache_len == 48 and spec.capture is None  # decode's HEADROOM
    assert captured.io_names(spec, 2) == phase_module("decode").io_names(spec, 2)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        captured.check(replace(spec, context_len=5000, cache_len=None), {"max_positions": 4096, "layers": 2})


# -- the capture job ------------------------------------------------------------------------


def _spec(tmp_path: Path, app: str, **options) -> CaptureSpec:
    opts = {"max_variants": 3, "select": "spread", "timed_runs": 1, **options}
    return CaptureSpec(
        key="test", model=model_spec("llama"), app=app, options=CaptureOptions(**opts), parity_steps=8,
        store=str(tmp_path / "captured_inputs"), app_path=str(ROOT), threads=1,
    )


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The bundled example: generate() of 300 tokens after a 128-token prompt."""
    return captured.capture_job(_spec(tmp_path_factory.mktemp("example"), EXAMPLE))


@pytest.mark.slow  # a 300-token generation of the bundled example
def test_a_300_token_generation_yields_the_phases_asked_for_not_300(example):
    assert example.ok, example.failure
    assert example.total_calls == 300  # the prefill, then one decode call per token but the last
    kinds = [c["kind"] for c in example.calls]
    assert kinds.count("prefill") == 1 and kinds.count("decode") == 299
    kept = [(p.kind, p.prompt_len or p.context_len, p.call) for p in example.kept]
    assert kept == [("prefill", 128, 0), ("decode", 128, 1), ("decode", 277, 150), ("decode", 426, 299)]
    assert all(p.batch == 1 and Path(p.inputs).is_file() for p in example.kept)
    assert "kept: prefill p128, decode ctx128, decode ctx277, decode ctx426" in captured.describe(example)


@pytest.mark.slow  # shares the 300-token generation
def test_the_application_s_own_timings(example):
    t = example.timings
    assert t["app_runs"] == 1 and t["app_calls"] == 300
    assert 0 < t["app_ttft_ms"] < t["app_seconds"] * 1e3
    assert 0 < t["app_inter_token_ms_p10"] <= t["app_inter_token_ms_median"] <= t["app_inter_token_ms_p90"]
    assert 0 < t["app_outside_forward_share"] < 1
    assert len(example.inter_token_ns) == 298  # between the 299 decode calls
    assert set(example.at_calls) == {0, 1, 150, 299}
    assert "app_inter_token_ms" not in example.at_calls[0] and example.at_calls[150]["app_inter_token_ms"] > 0


@pytest.mark.parametrize(
    "app,message",
    [
        ("tests.capture_apps:raises", "raised ValueError: the application's own bug (at "),
        ("tests.capture_apps:never_calls", "returned without calling the model it was given (0 forward calls)"),
        ("tests.capture_apps:beams", "changed positions it held before"),
        ("tests.capture_apps:embeds", "none a prefill or decode phasesweep can represent: inputs_embeds"),
        ("tests.capture_apps:missing", "tests.capture_apps has no missing"),
        ("tests.no_such_module:run", "cannot import tests.no_such_module"),
    ],
)
def test_an_application_that_cannot_be_captured_says_why(tmp_path, app, message):
    result = captured.capture_job(_spec(tmp_path, app))
    assert not result.ok and result.failure.stage == "capture"
    assert message in result.failure.error and f"phase.app={app!r}" in result.failure.error
    assert not (tmp_path / "captured_inputs").exists() or not any((tmp_path / "captured_inputs").iterdir())


# -- a kept call's data is the application's -------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A hand-written batch-2 greedy loop, every call's logits kept by the application."""
    result = captured.capture_job(_spec(tmp_path_factory.mktemp("record"), "tests.capture_apps:record", max_variants=2))
    assert result.ok, result.failure
    return result, list(capture_apps.SEEN)


def test_the_reference_on_a_kept_call_is_what_the_application_saw(recorded):
    result, _ = recorded
    model = build_model(model_spec("llama"))
    dims = model_dims(model)
    # the timed run ran the loop again: SEEN holds its calls, equal to the capture run's (greedy)
    seen = capture_apps.SEEN
    for kept in result.kept:
        phase = captured.normalize(kept, "static")
        captured.check(phase, dims)
        data = captured.make_data(model, phase, "static", dims)
        at = seen[phase.call]
        np.testing.assert_array_equal(data.feeds["input_ids"], at["ids"].numpy())
        if phase.kind == "prefill":
            np.testing.assert_allclose(data.parity["ref_logits"][0], at["logits"].numpy(), atol=1e-6)
            continue
        # the cache is the application's: the reference's first step reproduces its logits
        np.testing.assert_allclose(data.parity["ref_logits"][0], at["logits"].numpy(), atol=1e-5)
        assert data.feeds["cache_position"].tolist() == [phase.context_len]
        # later steps are the application's next tokens, then the reference's greedy picks
        steps = data.parity["step_tokens"]
        assert steps.shape == (2, phase.parity_steps)
        following = [seen[i]["ids"] for i in range(phase.call, len(seen))]
        np.testing.assert_array_equal(steps[:, : len(following)], torch.cat(following, dim=1)[:, : phase.parity_steps])


@pytest.mark.slow  # an ONNX export and a benchmark
def test_a_captured_decode_exports_and_benchmarks_with_parity(recorded, tmp_path):
    result, _ = recorded
    kept = next(p for p in result.kept if p.kind == "decode" and p.call > 1)
    model = model_spec("llama")
    phase = captured.normalize(kept, model.kv_cache)
    export = export_job(ExportSpec("captured-test", model, phase, "onnx", str(tmp_path / "entry")))
    assert export.ok, export.failure and export.failure.traceback
    assert export.input_shapes["input_ids"] == [2, 1]
    assert export.input_shapes["past_key_values.0.key"][2] == phase.cache_len
    bench = bench_job(BenchSpec("llama_decode_onnxruntime_cpu", "onnxruntime", "cpu", model, phase, export.out_dir, FAST_BENCH))
    assert bench.ok, bench.failure
    assert bench.parity["steps"] == 8 and bench.parity["passed"]
    assert bench.metrics["tokens_per_s"] > 0 and "decode_bytes_per_step" in bench.metrics


# -- a sweep -----------------------------------------------------------------------------------


def _sweep(folder: Path, mlflow_db, cache_override, *jobs):
    from mlflow.tracking import MlflowClient

    from orchestrator.run.sweep import run_sweep

    uri = mlflow_db(folder)
    common = [cache_override, f"tracking.uri={uri}", f"tracking.artifact_root={folder / 'mlartifacts'}"]
    configs, overrides = compose_jobs(*[[*job, *common] for job in jobs], shrink=False)
    return MlflowClient(tracking_uri=uri), lambda: run_sweep(configs, overrides, folder / "out", "pytest: captured")


BENCH = ["bench.warmup_iters=20", "bench.min_seconds=0.5", "bench.max_seconds=2", "bench.target_ci=0.01"]
CAPTURED = ["phase=captured", f"phase.app={EXAMPLE}", "phase.capture.select=first", "phase.capture.max_variants=1",
            "phase.capture.timed_runs=2"]


@pytest.mark.slow
def test_a_captured_sweep_beside_a_synthetic_decode_of_the_same_shape(tmp_path, mlflow_db, cache_override):
    from orchestrator.read.stats import Conditions, compare_sweeps, disturbances

    client, run = _sweep(tmp_path, mlflow_db, cache_override, ["phase=decode", "phase.context_len=128", *BENCH],
                         [*CAPTURED, *BENCH])
    outcomes = run()
    exp = client.get_experiment_by_name("phasesweep")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("phasesweep.role") == "sweep"]
    kids = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    synthetic, decode, prefill = (
        "llama_decode_onnxruntime_cpu",
        "llama_decode_onnxruntime_cpu_captured-generate_app",
        "llama_prefill_onnxruntime_cpu",
    )
    assert set(kids) == {synthetic, decode, prefill}, sorted(kids)
    assert all(r.data.tags["status"] == "ok" for r in kids.values())
    assert {o.status for o in outcomes.values()} == {"ok"}
    assert kids[decode].data.params["phase.name"] == "captured" and kids[decode].data.tags["phase"] == "decode"
    assert kids[decode].data.params["shape.past_key_values.0.key"] == kids[synthetic].data.params["shape.past_key_values.0.key"]
    # the application's own figures, on the sweep's run
    m = parent.data.metrics
    assert m["llama.app_ttft_ms"] > 0 and m["llama.app_inter_token_ms_median"] > 0 and m["llama.app_runs"] == 2
    assert parent.data.params["capture.llama.calls"] == "300" and parent.data.params["capture.llama.kept"] == "2"
    record = json.loads(Path(client.download_artifacts(parent.info.run_id, "captures/llama.json", str(tmp_path))).read_text())
    assert record["total_calls"] == 300 and record["variants"] == sorted([decode, prefill])
    beside = json.loads(Path(client.download_artifacts(parent.info.run_id, "captures/benchmark_vs_app.json", str(tmp_path))).read_text())
    assert {r["variant"] for r in beside} == {decode, prefill}
    # the same shape, the same graph: the compare finds no difference beyond its noise
    samples = {}
    for name in (synthetic, decode):
        path = client.download_artifacts(kids[name].info.run_id, "latency_samples.json", str(tmp_path / name))
        samples[name] = json.loads(Path(path).read_text())["samples"]
    disturbed, speeds = disturbances(
        {"decode": Conditions.of(kids[synthetic].data.metrics)}, {"decode": Conditions.of(kids[decode].data.metrics)}, 0.05
    )
    report = compare_sweeps({"decode": samples[synthetic]}, {"decode": samples[decode]}, disturbed=disturbed, speeds=speeds)
    (row,) = report["variants"]
    assert row["verdict"] in ("same", "inconclusive"), row


@pytest.mark.slow
def test_an_application_that_raises_ends_the_sweep_before_any_run(tmp_path, mlflow_db, cache_override):
    client, run = _sweep(tmp_path, mlflow_db, cache_override, ["phase=captured", "phase.app=tests.capture_apps:raises"])
    with pytest.raises(ConfigError, match=r"the capture failed, nothing was exported or recorded:\n  phase.app='tests.capture_apps:raises' raised ValueError"):
        run()
    exp = client.get_experiment_by_name("phasesweep")
    assert exp is None or client.search_runs([exp.experiment_id]) == []
    assert not list((tmp_path / "out").glob("**/*"))  # nothing exported, nothing written


def test_a_dry_run_says_what_captured_stands_for(caplog, tmp_path):
    from orchestrator.run.sweep import run_sweep

    configs, overrides = compose_jobs([*CAPTURED, f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"], shrink=False)
    with caplog.at_level("INFO", logger="phasesweep"):
        assert run_sweep(configs, overrides, tmp_path / "out", "pytest", dry_run=True) == {}
    out = caplog.text
    assert "1 variant(s) read 'captured'" in out and "a dry run does not run the application" in out


def test_one_capture_serves_every_quantisation_of_the_same_weights(tmp_path):
    """The application runs the float reference: model.quant and quant_group change how the
    runtimes build it, not what the application calls, so one capture serves them all."""
    from orchestrator.plan.config import validate_all
    from orchestrator.plan.planner import make_plan
    from tests.conftest import CaptureRunner, capacity

    store = f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"
    jobs = [[*CAPTURED, f"model.quant={q}", f"model.quant_group={g}", store] for q, g in [("none", 32), ("int8", 32), ("int4", 64)]]
    configs, overrides = compose_jobs(*jobs, shrink=False)
    points = validate_all(configs, overrides)
    assert [(p.model.quant, p.model.quant_group) for p in points] == [("none", 32), ("int8", 32), ("int4", 64)]
    runner = CaptureRunner(kept=[])
    plan = make_plan(points, configs, overrides, capacity(), runner=runner)
    assert len(runner.specs) == 1 and list(plan.captures.labels.values()) == ["llama"]
