"""A sweep's Tracker in a new folder: MLflow makes the default store, the experiment keeps its
artifacts beside it. (Two sweeps at once on a new store: tests/test_faults.py.)"""

from __future__ import annotations

from pathlib import Path

from orchestrator.plan.config import TrackingCfg
from orchestrator.record.store import Store
from orchestrator.record.tracking import Tracker


def test_a_new_folder_gets_a_working_store_made_by_mlflow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default store: ./mlflow.db, ./mlartifacts
    tracker = Tracker(Store.checked(TrackingCfg()), background=True).connected()
    assert (tmp_path / "mlflow.db").is_file()
    exps = {e.name: e for e in tracker.client.search_experiments()}
    assert set(exps) == {"Default", "phasesweep"}
    assert exps["phasesweep"].experiment_id == tracker.experiment_id
    assert exps["phasesweep"].artifact_location == (tmp_path / "mlartifacts").as_uri()
    assert Path(exps["Default"].artifact_location) == tmp_path / "mlruns" / "0"
    run = tracker.client.create_run(tracker.experiment_id)
    tracker.client.log_param(run.info.run_id, "p", "1")
    assert tracker.client.get_run(run.info.run_id).data.params == {"p": "1"}


def test_an_export_is_linked_into_a_local_artifact_store_not_copied(tmp_path, monkeypatch):
    """A sealed export's files reach MLflow's local artifact folder as hard links (one copy on
    disk), which MLflow lists and hands back as its own; without hard links, a copy."""
    import errno
    import os

    monkeypatch.chdir(tmp_path)
    tracker = Tracker(Store.checked(TrackingCfg()), background=True).connected()
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    entry = tmp_path / "cache" / "entry"
    entry.mkdir(parents=True)
    (entry / "model.onnx.data").write_bytes(b"weights" * 1000)
    tracker.artifact(run_id, entry / "model.onnx.data", "exports/entry", link=True)
    stored = tmp_path / "mlartifacts" / run_id / "artifacts" / "exports" / "entry" / "model.onnx.data"
    assert stored.samefile(entry / "model.onnx.data") and os.stat(stored).st_nlink == 2
    assert [a.path for a in tracker.client.list_artifacts(run_id, "exports/entry")] == ["exports/entry/model.onnx.data"]
    got = Path(tracker.client.download_artifacts(run_id, "exports/entry/model.onnx.data", str(tmp_path / "dl")))
    assert got.read_bytes() == b"weights" * 1000

    def no_links(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    (entry / "model.onnx").write_bytes(b"graph")
    tracker.artifact(run_id, entry / "model.onnx", "exports/entry", link=True)
    copied = stored.parent / "model.onnx"
    assert copied.read_bytes() == b"graph" and not copied.samefile(entry / "model.onnx")


def test_only_a_local_artifact_store_is_linked_into():
    from orchestrator.record.tracking import local_folder

    assert local_folder("file:///data/mlartifacts/1/abc/artifacts") == Path("/data/mlartifacts/1/abc/artifacts")
    assert local_folder("/data/mlruns/0/abc/artifacts") == Path("/data/mlruns/0/abc/artifacts")
    for remote in ("mlflow-artifacts:/1/abc/artifacts", "s3://bucket/1/abc", "file://otherhost/x", "http://h/x"):
        assert local_folder(remote) is None, remote


class AuthServer:
    """A server that answers /health to anyone and MLflow's experiment search only to `user`:`password`,
    as MLflow's basic-auth app does; `seen` keeps the Authorization each search came with."""

    def __init__(self, user: str, password: str) -> None:
        import base64
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        good = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.answer(200 if self.path == "/health" else 404)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append(self.headers.get("Authorization"))
                self.answer(200 if self.headers.get("Authorization") == good else 401)

            def answer(self, code):
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_server_that_refuses_the_credentials_is_refused_when_the_store_is_checked(tmp_path, monkeypatch):
    """Store.checked (before planning, before Ray) sends the credentials MLflow would: a wrong
    password is refused()'s one line then, not an error after the plan is printed."""
    import pytest

    from orchestrator.plan.config import ConfigError

    server = AuthServer("admin", "right")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        with pytest.raises(ConfigError) as e:
            Store.checked(TrackingCfg(uri=server.url))
        assert str(e.value).startswith(f"tracking.uri='{server.url}' refused user 'admin' (401 not authenticated)")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0k")  # no password: the token goes, as MLflow's client sends it
        with pytest.raises(ConfigError):
            Store.checked(TrackingCfg(uri=server.url))
        assert server.seen[-1] == "Bearer t0k"
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "right")
        assert Store.checked(TrackingCfg(uri=server.url)).uri == server.url
        assert not (tmp_path / "mlflow.db").exists()
    finally:
        server.close()
