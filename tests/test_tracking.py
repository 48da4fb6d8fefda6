"""A sweep's Tracker in a new folder: MLflow makes the default store, the experiment keeps its
artifacts beside it. (Two sweeps at once on a new store: tests/test_faults.py.)"""

from __future__ import annotations

from pathlib import Path

from orchestrator.plan.config import TrackingCfg
from orchestrator.record.tracking import Tracker


def test_a_new_folder_gets_a_working_store_made_by_mlflow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default store: ./mlflow.db, ./mlartifacts
    tracker = Tracker(TrackingCfg(), background=True).connected()
    assert (tmp_path / "mlflow.db").is_file()
    exps = {e.name: e for e in tracker.client.search_experiments()}
    assert set(exps) == {"Default", "phasesweep"}
    assert exps["phasesweep"].experiment_id == tracker.experiment_id
    assert exps["phasesweep"].artifact_location == (tmp_path / "mlartifacts").as_uri()
    assert Path(exps["Default"].artifact_location) == tmp_path / "mlruns" / "0"
    run = tracker.client.create_run(tracker.experiment_id)
    tracker.client.log_param(run.info.run_id, "p", "1")
    assert tracker.client.get_run(run.info.run_id).data.params == {"p": "1"}
