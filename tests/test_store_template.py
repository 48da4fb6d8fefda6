"""A new local MLflow store starts as a copy of an empty template (orchestrator/record/store_template.py):
made by the first new store of an MLflow version, copied by the next, never holding anyone's
runs or experiments, never replacing a store that exists, and never in the way when the
cache cannot be used."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import mlflow
import pytest

from orchestrator.plan.config import TrackingCfg
from orchestrator.record import store_template
from orchestrator.record.tracking import Tracker


def rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("PHASESWEEP_CACHE_DIR", str(folder))
    return folder


def open_in(folder: Path, monkeypatch) -> Tracker:
    """A sweep's tracker run in `folder` (the default store: ./mlflow.db, ./mlartifacts)."""
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)
    return Tracker(TrackingCfg()).connected()


def test_the_first_new_store_makes_the_template_and_the_next_is_a_copy(cache, tmp_path, monkeypatch):
    template = store_template.template_path(mlflow.__version__)
    first = open_in(tmp_path / "a", monkeypatch)
    assert template.is_file(), "the first new store was not kept as the template"
    assert rows(template, "SELECT count(*) FROM experiments") == [(0,)]  # no experiment, whoever's folder
    assert rows(template, "SELECT count(*) FROM runs") == [(0,)]
    made = template.stat().st_mtime_ns

    second = open_in(tmp_path / "b", monkeypatch)
    assert template.stat().st_mtime_ns == made  # copied, not made again
    for folder, tracker in ((tmp_path / "a", first), (tmp_path / "b", second)):
        exps = {e.name: e for e in tracker.client.search_experiments()}
        # MLflow's own Default experiment, at this store's folder (not the template's), and ours next to it
        assert Path(exps["Default"].artifact_location) == folder / "mlruns" / "0"
        assert exps["phasesweep"].experiment_id == tracker.experiment_id == "1"
        assert exps["phasesweep"].artifact_location == (folder / "mlartifacts").as_uri()
        run = tracker.client.create_run(tracker.experiment_id)  # the copy is a working store at MLflow's head
        tracker.client.log_param(run.info.run_id, "p", "1")
        assert tracker.client.get_run(run.info.run_id).data.params == {"p": "1"}


def test_a_store_that_exists_is_never_replaced(cache, tmp_path, monkeypatch):
    tracker = open_in(tmp_path / "a", monkeypatch)
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    open_in(tmp_path / "b", monkeypatch)  # the template exists now
    db = tmp_path / "a" / "mlflow.db"
    assert not store_template.seed(db, mlflow.__version__)
    again = open_in(tmp_path / "a", monkeypatch)
    assert again.client.get_run(run_id).info.run_id == run_id


def test_a_store_holding_runs_is_never_kept_as_the_template(cache, tmp_path, monkeypatch):
    tracker = open_in(tmp_path / "a", monkeypatch)
    tracker.client.create_run(tracker.experiment_id)
    store_template.template_path(mlflow.__version__).unlink()
    store_template.save(tmp_path / "a" / "mlflow.db", mlflow.__version__)
    assert not store_template.template_path(mlflow.__version__).exists()
    assert not list(cache.iterdir()), "a temporary file was left in the cache"


def test_a_cache_that_cannot_be_written_leaves_mlflow_to_make_the_store(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("PHASESWEEP_CACHE_DIR", str(blocked / "cache"))
    tracker = open_in(tmp_path / "a", monkeypatch)
    assert tracker.experiment_id == "1"
    assert {e.name for e in tracker.client.search_experiments()} == {"Default", "phasesweep"}


def test_only_a_local_sqlite_store_is_seeded(cache):
    assert store_template.sqlite_path("sqlite:////x/mlflow.db") == Path("/x/mlflow.db")
    for uri in ("http://127.0.0.1:5000", "postgresql://u@h/db", "file:///x/mlruns"):
        assert store_template.sqlite_path(uri) is None
