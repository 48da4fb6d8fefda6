"""Catching regressions end to end (docs/regressions.md), on real sweeps into one MLflow store:

- a runtime module outside this repository, in a git checkout of its own (a copy of the test-only
  `spin` backend, tests/spin_backend/: eager plus a busy-wait of spin_us per timed call): each
  sweep records that checkout's commit beside this one's; held against `tracking.baseline`, an
  identical re-run does not alert, a 4x spin does and exits with status 3 (orchestrator/entry.py);
- five sweeps of the default grid (llama prefill onnxruntime cpu, shrunk): their history plot
  is logged on the experiment's latest sweep and drawn in `report --format html`.

The sweeps run in this process on one local Ray (as tests/test_verdict.py runs its own).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONF, SHAPE_OVERRIDES, SHRINK
from tests.test_verdict import BENCH, SPIN, SPIN_US, VARIANT, compose

pytestmark = pytest.mark.slow
DEFAULT = "llama_prefill_onnxruntime_cpu"


def git(folder: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> tuple[Path, str]:
    """(folder, commit): the spin runtime and its yaml, committed in a git checkout of their own."""
    repo = tmp_path_factory.mktemp("runtime_repo")
    shutil.copy(SPIN / "spin_runtime.py", repo)
    shutil.copytree(SPIN / "conf", repo / "conf")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "the spin runtime")
    return repo, git(repo, "rev-parse", "HEAD")


def run(overrides: list[str], out: Path, label: str) -> int:
    """One sweep through the driver's exit path: its exit status (0 when it returns)."""
    from orchestrator.entry import run_or_exit

    try:
        run_or_exit([compose(overrides)], [overrides], out / label, f"pytest test_regressions: {label}")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


@pytest.fixture(scope="module")
def swept(tmp_path_factory, mlflow_db, cache_override, outside):
    """The spin sweeps (baseline, rerun held against last:1, slow held against last:1) in
    experiment `spin`, five default-grid sweeps in `nightly`: {"uri", "codes", "client"}."""
    from mlflow.tracking import MlflowClient

    from orchestrator.plan.config import validate_all
    from orchestrator.run.scheduler import Scheduler

    repo, _ = outside
    folder = tmp_path_factory.mktemp("regressions")
    uri = mlflow_db(folder)
    store = [cache_override, f"tracking.uri={uri}", f"tracking.artifact_root={folder / 'mlartifacts'}", "tracking.resume=false"]
    spin = ["model=llama", "phase=decode", "backend=spin", f"hydra.searchpath=[file://{repo / 'conf'}]", *BENCH, *store,
            "tracking.experiment=spin", *SHAPE_OVERRIDES]  # fmt: skip
    nightly = [*SHRINK, *store, "tracking.experiment=nightly", "bench.quality=false"]
    codes = {}
    sys.modules.pop("spin_runtime", None)  # another test file in this process may have imported tests/spin_backend's
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(repo))  # spin_runtime imported by name here, on Ray's workers and their processes
        path = [str(repo), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), str(CONF.parent)]
        mp.setenv("PYTHONPATH", os.pathsep.join(path))
        (point,) = validate_all([compose(spin)], [spin])
        with Scheduler(point.cluster):
            codes["baseline"] = run([*spin, f"backend.options.spin_us={SPIN_US}"], folder, "baseline")
            codes["rerun"] = run([*spin, f"backend.options.spin_us={SPIN_US}", "tracking.baseline=last:1"], folder, "rerun")
            codes["slow"] = run([*spin, f"backend.options.spin_us={4 * SPIN_US}", "tracking.baseline=last:1"], folder, "slow")
            for i in range(5):
                codes[f"nightly{i}"] = run(nightly, folder, f"nightly{i}")
    sys.modules.pop("spin_runtime", None)
    return {"uri": uri, "codes": codes, "client": MlflowClient(uri)}


def sweeps_of(swept, experiment: str) -> list:
    client = swept["client"]
    exp = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([exp], "tags.`phasesweep.role` = 'sweep'", order_by=["attributes.start_time ASC"])


def variant_of(swept, sweep):
    (run,) = swept["client"].search_runs([sweep.info.experiment_id], f"tags.mlflow.parentRunId = '{sweep.info.run_id}'")
    return run


def test_each_sweep_records_this_checkout_s_and_the_outside_module_s_commit(swept, outside):
    _, commit = outside
    own = git(Path(__file__).parent, "rev-parse", "HEAD")
    for sweep in sweeps_of(swept, "spin"):
        kid = variant_of(swept, sweep)
        for tags in (sweep.data.tags, kid.data.tags):
            assert tags["code.commit"] == own and tags["code.spin_runtime.commit"] == commit
            assert tags["code.spin_runtime.dirty"] == "False" and "code.tasks.export.none.commit" not in tags  # in this checkout
        assert kid.data.tags["env.version.torch"]  # the library versions: the variant's env.* tags, as before
    summary = swept["client"].download_artifacts(sweeps_of(swept, "spin")[0].info.run_id, "summary.txt")
    text = Path(summary).read_text()
    assert f"code of spin_runtime: {commit[:10]}" in text and "libraries: " in text and "torch " in text


def test_an_identical_rerun_does_not_alert_and_a_known_slowdown_does(swept):
    codes = swept["codes"]
    baseline, rerun, slow = sweeps_of(swept, "spin")
    assert codes["baseline"] == 0 and "alert.baseline" not in baseline.data.tags
    assert codes["rerun"] == 0, variant_of(swept, rerun).data.tags
    assert "alert" not in variant_of(swept, rerun).data.tags and rerun.data.metrics["alerts"] == 0
    assert codes["slow"] == 3  # orchestrator.entry.ALERT_EXIT
    tags = variant_of(swept, slow).data.tags
    assert tags["alert"].startswith("slower ") and tags["alert.baseline"] == rerun.info.run_name
    assert slow.data.tags["alert.variants"] == VARIANT and slow.data.metrics["alerts"] == 1
    text = Path(swept["client"].download_artifacts(slow.info.run_id, "summary.txt")).read_text()
    assert f"1 ALERT(S): {VARIANT}" in text


def test_five_default_sweeps_have_a_history_on_the_experiment_and_in_the_html_report(swept, tmp_path):
    from orchestrator.report import main

    nightly = sweeps_of(swept, "nightly")
    assert len(nightly) == 5 and all(swept["codes"][f"nightly{i}"] == 0 for i in range(5))
    assert all(variant_of(swept, s).info.run_name == DEFAULT for s in nightly)
    out = tmp_path / "history.html"
    assert main(["--history", "nightly", "--uri", swept["uri"], "--format", "html", "--out", str(out)]) == 0
    assert out.read_text().count('<img alt="history"') == 1 and "5 measurements of 1 variant(s)" in out.read_text()
    client = swept["client"]
    logged = {a.path for a in client.list_artifacts(nightly[-1].info.run_id, "history")}
    assert "history/history.png" in logged
    png = Path(client.download_artifacts(nightly[-1].info.run_id, "history/history.png", str(tmp_path)))
    assert png.stat().st_size > 10_000
    sweep_page = tmp_path / "report.html"
    assert main([nightly[-1].info.run_id, "--uri", swept["uri"], "--format", "html", "--out", str(sweep_page)]) == 0
    assert "<h2>History</h2>" in sweep_page.read_text()
