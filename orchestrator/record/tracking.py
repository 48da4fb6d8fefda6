"""MLflow: one parent run per sweep, one child run per variant, batched logging.

The driver owns every run's life: a worker that died cannot report its own end.
mlflow is imported lazily so `python sweep.py --help` stays instant.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from orchestrator.common.signals import Deferring
from orchestrator.plan.config import TrackingCfg
from orchestrator.record.journal import Journal, Sender
from orchestrator.record.links import experiment_tags
from orchestrator.record.store import (
    Store,
    check_reachable,
    credentials_checked,
    is_server,
    quick_http,
    resolve_uri,
    store_lock,
)
from tasks.measure.machine import alive
from tasks.worker.heap import imports_uncollected

MAX_PARAMS, MAX_METRICS, MAX_TAG = 100, 1000, 5000  # MLflow's per-batch and per-value limits
VARIANTS = "tags.`phasesweep.role` = 'variant'"


def search_all(client: Any, experiment_id: str, filter_string: str) -> list[Any]:
    """Every run of the experiment matching the filter, all pages."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=5000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def existing_runs(cfg: TrackingCfg) -> dict[str, list[str]]:
    """bench key -> the statuses of the variant runs the store holds with it, oldest first.
    Read only: a store or experiment not there yet is not made (a sqlite file not there is not
    even opened, nor MLflow imported); a server that cannot be reached is a ConfigError."""
    uri = resolve_uri(cfg)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return {}
    check_reachable(uri)
    quick_http()
    from mlflow.tracking import MlflowClient  # lazy: mlflow, only once a store is opened

    client = MlflowClient(tracking_uri=uri)
    with credentials_checked(uri):
        exp = client.get_experiment_by_name(cfg.experiment)
    if exp is None:
        return {}
    found: dict[str, list[str]] = {}
    for run in sorted(search_all(client, exp.experiment_id, VARIANTS), key=lambda r: r.info.start_time):
        key = run.data.tags.get("bench_key")
        if key:
            ok = run.data.tags.get("status") == "ok" and run.info.status == "FINISHED"
            found.setdefault(key, []).append("ok" if ok else run.data.tags.get("status", run.info.status.lower()))
    return found


SERIES_PREFIX = "depth_"  # tasks/depth_series.py PREFIX: a run's step metrics


def run_series(client: Any, run: Any) -> dict[str, list[tuple[int, float]]]:
    """A run's series (step metrics whose names start with SERIES_PREFIX): metric -> (step, value)."""
    keys = [k for k in run.data.metrics if k.startswith(SERIES_PREFIX)]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)) for k in keys}


def apply(client: Any, op: str, args: list[Any]) -> None:
    """One journaled write (orchestrator/record/journal.py) on an MLflow client."""
    from mlflow.entities import Metric, Param, RunTag  # lazy: mlflow, only once a store is opened

    if op == "log":
        run_id, m, p, t = args
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, ts, step[0] if step else 0) for k, v, ts, *step in m],  # a series' point: its step
            params=[Param(k, v) for k, v in p],
            tags=[RunTag(k, v) for k, v in t],
        )
    elif op == "artifact":
        client.log_artifact(*args)
    elif op == "end":
        client.set_terminated(args[0], status=args[1])
    elif op == "text":
        client.log_text(*args)
    elif op == "table":
        client.log_table(args[0], data=args[1], artifact_file=args[2])
    else:
        raise ValueError(f"unknown journal entry {op!r}")


def local_folder(uri: str) -> Path | None:
    """The folder a local artifact URI (file:///..., or a plain absolute path) names; None for
    any other store (an MLflow server's mlflow-artifacts:/, s3://, ...)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(url2pathname(parsed.path))
    return Path(uri) if not parsed.scheme and Path(uri).is_absolute() else None


class Tracker:
    """The sweep's tracking store (orchestrator.record.store.Store, checked before). With
    `background` and a local store, the connection (MLflow's import, opening or making the store:
    seconds) runs in a thread beside Ray's start; `client` and `experiment_id` wait for it and
    raise what it raised."""

    def __init__(self, store: Store, background: bool = False):
        quick_http()
        # no "View run at" line from MLflow on every ended run: stdout is the sweep's (links.ui_lines)
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri = store.uri
        self._artifact_uris: dict[str, str] = {}
        self._client: Any = None
        self._experiment_id: str | None = None
        self._error: BaseException | None = None
        self._connecting: threading.Thread | None = None
        # a server is opened now: a refusal of the credentials is said before any work
        if background and not is_server(self.uri):
            self._connecting = threading.Thread(target=self._connect, args=(store,), name="tracker-connect", daemon=True)
            self._connecting.start()
        else:
            self._connect(store)
        self.sender: Sender | None = None  # a server's writes go through a journal on disk (the connection needs none)
        if store.journal is not None:
            self.sender = Sender(Journal(store.journal, self.uri), self.uri, store.outage_s, self._apply)
        if self._connecting is None:
            self._raise()

    def _connect(self, store: Store) -> None:
        try:
            with imports_uncollected():  # MLflow's import and a new store's migrations make objects to keep
                from mlflow.tracking import MlflowClient  # before the lock: none waits on our import

                with store_lock(self.uri), credentials_checked(self.uri):
                    # each call whole: a Ctrl-C waits for the write in flight (orchestrator.common.signals)
                    self._client = Deferring(MlflowClient(tracking_uri=self.uri))
                    self._experiment_id = self._experiment(store.experiment, store.artifact_root)
        except BaseException as e:  # noqa: BLE001 - raised where the connection is first used
            self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def connected(self) -> Tracker:
        """Once the connection is made: this tracker; what it raised if it failed."""
        if self._connecting is not None:
            self._connecting.join()
            self._connecting = None
        self._raise()
        return self

    @property
    def client(self) -> Any:
        return self.connected()._client

    @property
    def experiment_id(self) -> str:
        return self.connected()._experiment_id

    def series(self, run: Any) -> dict[str, list[tuple[int, float]]]:
        """An earlier run's series (its depth series), read back to draw them again."""
        return run_series(self.client, run)

    def _experiment(self, name: str, root: Path | None) -> str:
        """The experiment's id, created when new, with the tags the UI opens it by
        (links.experiment_tags); sweeps racing to create it on a server (the lock covers sqlite
        only) take the winner's."""
        from mlflow.exceptions import MlflowException  # lazy: mlflow, only once a store is opened

        tags = experiment_tags()
        exp = self._client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self._client.create_experiment(name, artifact_location=root.as_uri() if root else None, tags=tags)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS" or (exp := self._client.get_experiment_by_name(name)) is None:
                    raise
        for key, value in tags.items():  # an experiment made before, or by hand
            if exp.tags.get(key) != value:
                self._client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id

    # -- what earlier sweeps left ---------------------------------------------------------
    def search(self, filter_string: str) -> list[Any]:
        return search_all(self.client, self.experiment_id, filter_string)

    def finished_ok(self) -> dict[str, Any]:
        """bench key -> the latest variant run that ended ok with it."""
        found: dict[str, Any] = {}
        runs = self.search(f"{VARIANTS} and tags.status = 'ok' and attributes.status = 'FINISHED'")
        for run in sorted(runs, key=lambda r: r.info.start_time):
            key = run.data.tags.get("bench_key")
            if key:
                found[key] = run
        return found

    def orphans(self, heartbeat_timeout_s: float) -> list[tuple[Any, str]]:
        """Runs left RUNNING by a driver that is gone: (run, why). On this host a driver is
        gone when its pid is; elsewhere when its sweep's heartbeat is older than the timeout."""
        host, now = socket.gethostname(), time.time()
        running = self.search("attributes.status = 'RUNNING'")
        beats = {r.info.run_id: float(r.data.tags.get("driver.heartbeat", 0)) for r in running}
        out = []
        for run in running:
            tags = run.data.tags
            pid, where = tags.get("driver.pid"), tags.get("driver.host")
            if not pid or not where:
                continue
            beat = beats.get(tags.get("mlflow.parentRunId", run.info.run_id), 0.0)
            if where == host and pid.isdigit() and not alive(int(pid)):
                out.append((run, f"its driver (pid {pid} on {where}) is gone"))
            elif where != host and beat and now - beat > heartbeat_timeout_s:
                out.append((run, f"its driver on {where} sent no heartbeat for {now - beat:.0f}s"))
        return out

    # -- low level -------------------------------------------------------------------
    def log(
        self,
        run_id: str,
        metrics: dict[str, float] | None = None,
        params: dict[str, Any] | None = None,
        tags: dict[str, Any] | None = None,
        series: dict[str, list[tuple[int, float]]] | None = None,
    ) -> None:
        """Everything in as few calls as MLflow's batch limits allow; `series`: metric -> its
        (step, value) points, logged as MLflow step metrics (the UI draws them against the step)."""

        now = int(time.time() * 1000)
        m: list[tuple] = [(k, float(v), now) for k, v in (metrics or {}).items() if v is not None]
        m += [(k, float(v), now, int(step)) for k, points in (series or {}).items() for step, v in points]
        p = [(k, str(v)[:MAX_TAG]) for k, v in (params or {}).items()]
        t = [(k, str(v)[:MAX_TAG]) for k, v in (tags or {}).items()]
        while m or p or t:
            self._write("log", run_id, m[:MAX_METRICS], p[:MAX_PARAMS], t[:MAX_PARAMS])
            m, p, t = m[MAX_METRICS:], p[MAX_PARAMS:], t[MAX_PARAMS:]

    def artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None, link: bool = False) -> None:
        """A file into the run's artifacts. `link`: for a file never written again (a sealed export
        cache entry's), a hard link where the artifact store is a local folder on the same file
        system, so its bytes are on disk once; otherwise (a server, another file system) a copy."""
        if link and self.sender is None and self._link(run_id, Path(path), artifact_path):
            return
        self._write("artifact", run_id, str(Path(path).resolve()), artifact_path)

    def _link(self, run_id: str, path: Path, artifact_path: str | None) -> bool:
        root = local_folder(self.artifact_uri(run_id))
        if root is None:
            return False
        dest = root.joinpath(*(artifact_path or "").split("/"), path.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except FileExistsError:
            return dest.samefile(path)
        except OSError:  # another file system, or one without hard links
            return False
        return True

    def artifact_uri(self, run_id: str) -> str:
        """Where a run's artifacts are stored (runs:/ URIs do not reach across runs in the UI)."""
        if run_id not in self._artifact_uris:
            self._artifact_uris[run_id] = self.client.get_run(run_id).info.artifact_uri
        return self._artifact_uris[run_id]

    def end(self, run_id: str, status: str) -> None:
        self._write("end", run_id, status)

    def _write(self, op: str, *args: Any) -> None:
        """A write to the store: straight to a local one; through the journal to a server."""
        if self.sender is None:
            self._apply(op, list(args))
        else:
            self.sender.send(op, list(args))

    def _apply(self, op: str, args: list[Any]) -> None:
        apply(self.client, op, args)

    # -- the sweep's runs ----------------------------------------------------------------
    def start_sweep(self, name: str, params: dict[str, Any], tags: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=name, tags={"phasesweep.role": "sweep"})
        self.log(run.info.run_id, params=params, tags=tags)
        return run.info.run_id

    def start_variant(
        self, parent: str, name: str, tags: dict[str, Any], params: dict[str, Any], config_yaml: str
    ) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={"mlflow.parentRunId": parent, "phasesweep.role": "variant", "variant": name},
        )
        run_id = run.info.run_id
        self.log(run_id, params=params, tags=tags)
        self.log_text(run_id, config_yaml, "config.yaml")
        return run_id

    def log_dict(self, run_id: str, obj: Any, name: str, indent: int | None = 1) -> None:
        self.log_text(run_id, json.dumps(obj, indent=indent, default=str), name)

    def log_table(self, run_id: str, rows: list[dict[str, Any]], name: str) -> None:
        """Rows as an MLflow table (the UI's artifact view shows it as one), every cell text."""
        if rows:
            columns = {c: [str(r.get(c, "")) for r in rows] for c in rows[0]}
            self._write("table", run_id, columns, name)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self._write("text", run_id, text, name)

    def log_failure(self, run_id: str, stage: str, error: str, traceback: str) -> None:
        self.log(run_id, tags={"status": "failed", "failure_stage": stage, "error": error})
        if traceback:
            self.log_text(run_id, traceback, "error.txt")
