"""History, alerts and the recorded revision, on synthetic sweeps in a temporary MLflow store:
each variant's series across sweeps (kept apart by machine), the sweeps where it changed by the
verdict's rules, `tracking.baseline`'s alerts, the report verb, and git read for the revision.
The same end to end on real sweeps: tests/test_regressions.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.plan.config import ConfigError, TrackingCfg
from orchestrator.read import alert as al
from orchestrator.read import history as hi
from orchestrator.record import revision as rv
from tests.test_compare import stalls

A, B = "llama_decode_onnxruntime_cpu", "llama_prefill_onnxruntime_cpu"
HERE, THERE = {"env.host": "here", "env.cpu_model": "EPYC", "env.cpus_usable": "2"}, {"env.host": "there", "env.cpu_model": "Xeon", "env.cpus_usable": "8"}
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # as orchestrator.read.store.open_store sets it
T0 = 1_800_000_000_000  # ms: the sweeps' start times are set, one minute apart


def variant(client, exp, parent, name, t, median_ms, machine, seed, status="ok", stage=None):
    rng = np.random.default_rng(seed)
    samples = stalls(rng, 600, median_ms=median_ms, stall_rate=0.0, sigma=0.02)
    tags = {"mlflow.parentRunId": parent, "phasesweep.role": "variant", "variant": name, "status": status, **machine}
    tags |= {"failure_stage": stage} if stage else {}
    run = client.create_run(exp, run_name=name, start_time=t + 1, tags=tags).info.run_id
    med = float(np.median(samples)) / 1e6
    for key, value in {"latency_ms_median": med, "latency_ms_median_ci_low": med * 0.99, "latency_ms_median_ci_high": med * 1.01,
                       "machine_probe_us": 100.0}.items():  # fmt: skip
        client.log_metric(run, key, value)
    client.log_text(run, json.dumps({"variant": name, "unit": "ns", "samples": samples.tolist()}), "latency_samples.json")
    client.set_terminated(run, "FINISHED" if status == "ok" else "FAILED")
    return run


def sweep(client, exp, i, medians, committed=None):
    """Sweep `sweep_{i}` at minute i: {variant: (median_ms, machine[, status, stage])}."""
    t = T0 + 60_000 * i
    tags = {"phasesweep.role": "sweep", "code.commit": f"{i:040x}", "code.dirty": "False"}
    tags |= {"code.committed": committed} if committed else {}
    sid = client.create_run(exp, run_name=f"sweep_{i}", start_time=t, tags=tags).info.run_id
    for n, (name, (med, machine, *failed)) in enumerate(medians.items()):
        variant(client, exp, sid, name, t, med, machine, seed=100 * i + n, status=failed[0] if failed else "ok",
                stage=failed[1] if failed else None)  # fmt: skip
    client.set_terminated(sid, "FINISHED")
    return sid


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_db):
    """Experiment `nightly`: A 1.0 ms in sweeps 1-3, 1.3 ms (30% slower) in 4-5, broken parity in
    6; B on another machine, 1.0 ms throughout. Commit dates run backwards from sweep 1."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("history")
    uri = mlflow_db(folder)
    client = MlflowClient(uri)
    exp = client.create_experiment("nightly", artifact_location=(folder / "art").as_uri())
    ids = {}
    for i, a_ms in enumerate((1.0, 1.0, 1.0, 1.3, 1.3), start=1):
        ids[i] = sweep(client, exp, i, {A: (a_ms, HERE), B: (1.0, THERE)}, committed=f"2026-01-{10 - i:02d}T00:00:00+00:00")
    ids[6] = sweep(client, exp, 6, {A: (1.3, HERE, "failed", "parity")})
    return uri, client, ids


def test_each_variant_has_a_series_per_machine_and_its_changes_are_the_verdicts(store):
    _, client, ids = store
    sweeps = [client.get_run(ids[i]) for i in range(1, 6)]
    series = hi.series_of(client, sweeps)
    hi.judge_steps(client, series)
    assert set(series) == {(hi.machine_of(p.run), p.variant) for points in series.values() for p in points}
    here = next(points for (m, v), points in series.items() if v == A)
    there = next(points for (m, v), points in series.items() if v == B)
    assert "here" in here[0].machine and "there" in there[0].machine and len(here) == len(there) == 5
    assert [p.change for p in here] == [None, None, None, "slower", None]  # the step, then the same again
    assert 1.25 < here[3].ratio[0] < 1.35 and here[3].against == "sweep_3"
    assert not [p for p in there if p.change]
    lines = hi.change_lines(series)
    assert lines[0].startswith("10 measurements of 2 variant(s) on 2 machine(s): changes")
    assert len(lines) == 2 and lines[1].startswith(f"  sweep_4 (code {'0' * 10}): {A} slower, 1.2")


def test_commit_order_follows_the_code_s_commit_date(store):
    _, client, ids = store
    series = hi.series_of(client, [client.get_run(ids[i]) for i in range(1, 6)], order="commit")
    here = next(points for (m, v), points in series.items() if v == A)
    assert [p.sweep.info.run_name for p in here] == [f"sweep_{i}" for i in (5, 4, 3, 2, 1)]


def test_report_history_logs_its_plot_on_the_latest_sweep_and_embeds_it_in_html(store, tmp_path):
    from orchestrator.report import main

    uri, client, ids = store
    out = tmp_path / "history.html"
    assert main(["--history", "nightly", "--uri", uri, "--format", "html", "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count('<img alt="history"') == 1 and "sweep_4 (code" in page and "slower" in page
    logged = {a.path for a in client.list_artifacts(ids[6], "history")}
    assert logged == {"history/history.png", "history/history.json", "history/history.txt"}
    assert main(["--history", "nightly", "--uri", uri, "--format", "markdown", "--out", str(tmp_path / "h.md")]) == 0
    assert (tmp_path / "h_history.png").stat().st_size > 10_000 and "![history](h_history.png)" in (tmp_path / "h.md").read_text()
    assert "- 6 sweeps, 5 of them measured, time order" in (tmp_path / "h.md").read_text()  # sweep 6 measured nothing ok
    assert main(["--history", "nightly", "--uri", uri, "--order", "commit", "--format", "text"]) == 0
    assert main(["--history", "nope", "--uri", uri]) == 2 and main(["--uri", uri]) == 2


def test_a_sweep_s_html_report_draws_its_experiment_s_history(store, tmp_path):
    from orchestrator.read.report_build import report

    uri, _, ids = store
    page = report(uri, ids[5], "html")
    assert "<h2>History</h2>" in page and page.count('<img alt="history"') == 1
    assert "<h2>History</h2>" not in report(uri, ids[1], "html")  # nothing before it: no history yet


def rows(client, sid, baseline):
    return {r["variant"]: r for r in al.hold(client, sid, TrackingCfg(baseline=baseline))}


def test_the_slowdown_alerts_and_an_identical_rerun_does_not(store):
    _, client, ids = store
    slower = rows(client, ids[4], "last:1")  # 1.3 ms against sweep 3's 1.0 ms
    assert slower[A]["alert"].startswith("slower 1.3") and slower[A]["baseline"] == "sweep_3"
    assert slower[B]["alert"] == "" and slower[B]["verdict"] == "same 1"
    same = rows(client, ids[5], "last:1")  # 1.3 ms again: identical to the sweep before
    assert same[A]["alert"] == "" and same[B]["alert"] == ""
    majority = rows(client, ids[5], "last:2")  # slower than sweep 3 only: 1 of 2
    assert majority[A]["alert"] == "" and majority[A]["verdict"] in ("same 1, slower 1", "slower 1, same 1")
    named = rows(client, ids[5], "sweep_2")
    assert named[A]["alert"].startswith("slower") and named[A]["baseline"] == "sweep_2"


def test_broken_parity_alerts_and_another_machine_is_no_baseline(store):
    _, client, ids = store
    broken = rows(client, ids[6], "last:3")
    assert set(broken) == {A} and broken[A]["alert"] == "parity broken (ok in sweep_5)"
    lines = al.alert_lines(TrackingCfg(baseline="last:3"), list(broken.values()))
    assert f"1 ALERT(S): {A}" in lines[0] and "ALERT parity broken" in lines[1]
    there = rows(client, ids[1], "last:3")  # nothing before it
    assert {r["verdict"] for r in there.values()} == {"no baseline"}


def test_a_named_baseline_that_is_not_there_is_a_config_error(store):
    _, client, ids = store
    exp = client.get_run(ids[1]).info.experiment_id
    assert al.named_sweep(client, exp, ids[2]).info.run_name == "sweep_2"
    with pytest.raises(ConfigError, match=r"tracking.baseline='sweep_99': no sweep run"):
        al.named_sweep(client, exp, "sweep_99")


@pytest.mark.parametrize("value", ["last:0", "last:x", "last:", "two words", ""])
def test_a_bad_baseline_is_refused_with_the_key(value):
    with pytest.raises(ConfigError, match="tracking.baseline="):
        TrackingCfg(baseline=value).check()
    with pytest.raises(ConfigError, match="tracking.min_effect=1.5"):
        TrackingCfg(min_effect=1.5).check()
    assert TrackingCfg(baseline="last:5").baseline_last() == 5 and TrackingCfg(baseline="sweep_x").baseline_last() is None


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_the_revision_of_a_module_in_another_checkout_is_read_and_none_outside_git(tmp_path):
    repo = tmp_path / "ext"
    repo.mkdir()
    (repo / "my_runtime.py").write_text("X = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    path = rv.module_file("my_runtime", [str(repo)])
    assert path == (repo / "my_runtime.py").resolve()
    tags = rv.outside("my_runtime", path, rv.checkout(rv.HERE)[0])
    assert len(tags["code.my_runtime.commit"]) == 40 and tags["code.my_runtime.dirty"] == "False"
    assert tags["code.my_runtime.root"] == str(repo.resolve())
    (repo / "my_runtime.py").write_text("X = 2\n")
    rv.checkout.cache_clear()  # read once per sweep: a new sweep reads it again
    assert rv.outside("my_runtime", path, None)["code.my_runtime.dirty"] == "True"
    assert "code of my_runtime: " in rv.revision_lines(tags)[0] and "+dirty" not in rv.revision_lines(tags)[0]
    plain = tmp_path / "plain"
    plain.mkdir()
    assert rv.checkout(plain) is None and rv.outside("m", plain / "m.py", None) == {}
    # a module of this checkout records nothing of its own: the sweep's code.commit covers it
    assert rv.outside("x", rv.HERE / "revision.py", rv.checkout(rv.HERE)[0]) == {}


def test_library_versions_are_named_once_or_per_variant():
    envs = {A: {"env.version.onnxruntime": "1.31.1", "env.version.numpy": "2.4"}, B: {"env.version.onnxruntime": "1.30.0", "env.version.numpy": "2.4"}}
    (line,) = rv.library_lines(envs)
    assert line == f"libraries: numpy 2.4, onnxruntime 1.30.0 ({B}), onnxruntime 1.31.1 ({A})"
    assert rv.library_lines({}) == []


def test_report_help_names_the_history_verb():
    out = subprocess.run([sys.executable, "-m", "orchestrator.report", "--help"], capture_output=True, text=True, check=True)
    assert "--history [EXPERIMENT]" in out.stdout and "--order {time,commit}" in out.stdout
