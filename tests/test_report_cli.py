"""`python -m orchestrator.report`: the table and plots of an earlier sweep rebuilt from MLflow
alone. A sweep is driven by hand (orchestrator.run.sweep_run.SweepRun with a real Tracker on an sqlite
store, a scripted scheduler, no Ray) or its runs are written with MlflowClient; the report
must print the table the sweep printed."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import report as cli
from orchestrator.common.outcome import Outcome, Status
from orchestrator.plan.config import TrackingCfg
from orchestrator.read import report_build as rep
from orchestrator.read import store as st
from orchestrator.read import summary
from orchestrator.record.store import Store
from orchestrator.record.tracking import Tracker
from orchestrator.run.sweep_run import SweepRun
from tasks.specs import Failure
from tests.conftest import ROOT, plan_jobs
from tests.test_plots import PNG_SIGNATURE, png_size
from tests.test_sweep_run import JOBS, FakeScheduler, bench_ok, export_ok, key_of, parity_failed

A, B, EAGER, COMPILE = (
    "llama_prefill_onnxruntime_cpu",
    "llama_decode_onnxruntime_cpu",
    "llama_decode_eager_cpu",
    "llama_decode_compile_cpu",
)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, mlflow_db):
    """A sweep of JOBS (ok, parity failed, crashed, unstable, unplaceable, skipped), recorded
    in MLflow by SweepRun itself: (uri, parent run id, the table it printed, its outcomes)."""
    folder = tmp_path_factory.mktemp("swept")
    uri = mlflow_db(folder)
    tracker = Tracker(Store.checked(TrackingCfg(uri=uri, artifact_root=str(folder / "mlartifacts"))))
    plan = plan_jobs(*JOBS)
    run = SweepRun(plan, folder / "out", tracker, FakeScheduler())
    run.record_plan("python sweep.py -m phase=prefill,decode ...")
    run.start()
    for name, result in ((A, bench_ok(A)), (B, parity_failed(B)), (COMPILE, bench_ok(COMPILE, unstable=True))):
        run.on_export(key_of(plan, name), export_ok(key_of(plan, name), folder / name, artifact=False))
        run.on_bench(f"{name}#0", result)
    run.on_bench(f"{EAGER}#0", Failure("benchmark", "the benchmark's process died (exit code -9)"))
    text = run.finish(3.0)
    return uri, run.parent, text, list(run.outcomes.values())


def test_the_report_prints_the_table_the_sweep_printed(swept):
    uri, parent, text, outcomes = swept
    table = rep.report(uri, parent, "text")
    assert text.startswith(table.rstrip("\n")) and "code: " in text[len(table) :]  # then the code measured (docs/regressions.md)
    client = st.open_store(uri)
    rebuilt, _ = st.load_sweep(client, client.get_run(parent))
    assert summary.summary_rows(rebuilt) == summary.summary_rows(outcomes)
    assert summary.markdown_table(summary.summary_rows(rebuilt)) == summary.markdown_table(summary.summary_rows(outcomes))


def test_the_sweep_run_carries_plots_description_and_table(swept, tmp_path):
    uri, parent, text, outcomes = swept
    client = st.open_store(uri)
    files = {a.path for a in client.list_artifacts(parent)}
    assert {"summary.txt", "summary.json", "latency.png", "summary_table.json"} <= files
    note = client.get_run(parent).data.tags["mlflow.note.content"]
    assert "python sweep.py -m phase=prefill,decode" in note
    assert summary.markdown_table(summary.summary_rows(outcomes)) in note
    table = json.loads(Path(client.download_artifacts(parent, "summary_table.json", str(tmp_path))).read_text())
    assert table["columns"] == list(summary.summary_rows(outcomes)[0])
    assert [r[0] for r in table["data"]] == [o.name for o in outcomes]


def test_markdown_links_the_plots_written_next_to_it(swept, tmp_path):
    uri, parent, _, outcomes = swept
    out = tmp_path / "report.md"
    assert cli.main([parent, "--uri", uri, "--out", str(out)]) == 0
    text = out.read_text()
    assert summary.markdown_table(summary.summary_rows(outcomes)) in text
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert links == ["report_plots/latency.png"]  # one measured decode backend and one prefill: no other axes
    assert png_size(tmp_path / links[0])


def test_csv_is_the_table(swept, capsys):
    uri, parent, _, outcomes = swept
    assert cli.main([parent, "--uri", uri, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows == [{k: str(v) for k, v in r.items()} for r in summary.summary_rows(outcomes)]


def test_html_is_one_page_with_the_plots_embedded(swept, tmp_path):
    uri, parent, _, outcomes = swept
    out = tmp_path / "r.html"
    assert cli.main([parent, "--uri", uri, "--format", "html", "--out", str(out)]) == 0
    page = out.read_text()
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == PNG_SIGNATURE
    assert all(o.name in page for o in outcomes) and not list(tmp_path.glob("*_plots"))


# -- a store written by hand: references, reused runs, every plot ----------------------------
def _child(client, exp, parent, name, backend, ctx, median, **extra_tags):
    run = client.create_run(
        exp,
        run_name=name,
        tags={
            "mlflow.parentRunId": parent,
            "phasesweep.role": "variant",
            "model": "llama",
            "phase": "decode",
            "backend": backend,
            "device": "cpu",
            "status": "ok",
            "unstable": "False",
            **extra_tags,
        },
    )
    rid = run.info.run_id
    client.log_param(rid, "phase.context_len", ctx)
    client.log_param(rid, "shape.input_ids", json.dumps([1, 1]))
    client.log_param(rid, "shape.cache_position", json.dumps([1]))
    for k, v in {
        "latency_ms_median": median,
        "latency_ms_p90": median * 1.2,
        "tokens_per_s": 1000 / median,
        "peak_rss_mb": 400.0 if backend == "eager" else 250.0,
        "parity_max_abs_diff": 1e-6,
        "parity_steps": 8,
    }.items():
        client.log_metric(rid, k, v)
    client.set_terminated(rid)
    return rid


def _sweep(client, exp, name):
    run = client.create_run(exp, run_name=name, tags={"phasesweep.role": "sweep"})
    client.log_param(run.info.run_id, "command", f"python sweep.py # {name}")
    time.sleep(0.01)  # distinct start times: `latest` is the newest
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_db):
    """Two sweeps in experiment `ctx`: the second reuses the first's eager ctx64 run."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("store")
    uri = mlflow_db(folder)
    client = MlflowClient(uri)
    exp = client.create_experiment("ctx", artifact_location=(folder / "art").as_uri())
    first = _sweep(client, exp, "sweep_first")
    reused = _child(client, exp, first, "llama_decode_eager_cpu_ctx64", "eager", 64, 2.0)
    second = _sweep(client, exp, "sweep_second")
    _child(client, exp, second, "llama_decode_eager_cpu_ctx256", "eager", 256, 6.0)
    _child(client, exp, second, "llama_decode_onnxruntime_cpu_ctx64", "onnxruntime", 64, 1.0)
    _child(client, exp, second, "llama_decode_onnxruntime_cpu_ctx256", "onnxruntime", 256, 2.0, unstable="True")
    client.log_text(second, json.dumps({"llama_decode_eager_cpu_ctx64": reused}), "reused.json")
    return uri, client, first, second, reused


def test_reused_runs_are_part_of_the_report_and_every_plot_is_rebuilt(store, tmp_path):
    uri, client, _, second, reused = store
    outcomes, params = st.load_sweep(client, client.get_run(second))
    assert {o.name: o.reused_from for o in outcomes}["llama_decode_eager_cpu_ctx64"] == reused
    assert all(o.status == Status.OK and o.shapes == {"input_ids": [1, 1], "cache_position": [1]} for o in outcomes)
    assert [o.unstable for o in outcomes].count(True) == 1 and params["llama_decode_eager_cpu_ctx64"][
        "phase.context_len"
    ] == "64"
    text = rep.report(uri, second, "text")
    assert f"ok, reused from run {reused[:8]}" in text and "ok, unstable (iqr 0%)" in text
    out = tmp_path / "r.md"
    assert cli.main([second, "--uri", uri, "--out", str(out)]) == 0
    links = re.findall(r"\]\(([^)]+)\)", out.read_text())
    assert links == [
        f"r_plots/{p}"
        for p in (
            "latency.png",
            "plots/context_length.png",
            "plots/speedup_vs_eager.png",
            "plots/latency_vs_memory.png",
        )
    ]


def test_latest_and_an_experiment_name_resolve_to_the_newest_sweep(store):
    uri, client, _, second, _ = store
    assert st.find_sweep(client, "ctx").info.run_id == second
    assert st.find_sweep(client, "latest").info.run_id == second


def test_a_bad_reference_exits_2_with_a_clear_message(store, capsys, tmp_path):
    uri, _, _, _, reused = store
    assert cli.main(["no-such-thing", "--uri", uri]) == 2
    assert "neither a run id nor an experiment name" in capsys.readouterr().err
    assert cli.main([reused, "--uri", uri]) == 2
    assert "is not a sweep run (variant); pass its parent run's id" in capsys.readouterr().err
    assert cli.main(["latest", "--uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "no MLflow store" in capsys.readouterr().err


def test_a_sweep_with_nothing_measured_reports_its_table_without_plots(store):
    uri, client, *_ = store
    exp = client.get_experiment_by_name("ctx").experiment_id
    empty = _sweep(client, exp, "sweep_empty")
    o = Outcome("x", Status.SKIPPED, error="nothing to do")
    assert "(no variants)" in rep.report(uri, empty, "markdown") and summary.status_text(o) == "skipped: nothing to do"
    assert "(nothing measured)" in rep.report(uri, empty, "html")


@pytest.mark.slow
def test_a_real_sweep_and_its_report_print_the_same_table(tmp_path):
    """One tiny sweep through sweep.py (Ray, export, benchmark), then the report of `latest`."""
    from tests.conftest import SHRINK

    cmd = [sys.executable, str(ROOT / "sweep.py"), "-m", "model=llama", "phase=decode", "backend=eager", *SHRINK]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = subprocess.run(
        [sys.executable, "-m", "orchestrator.report", "latest", "--format", "text"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip() in done.stdout
