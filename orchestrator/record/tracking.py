"""MLflow: one parent run per sweep invocation, one child run per variant, batched logging.

The driver owns every run's life: a child run is created when its variant is planned and
ended with its final status here, because a worker that died cannot report its own death.
mlflow is imported lazily so `python sweep.py --help` stays instant.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.common.signals import Deferring
from orchestrator.plan.config import ConfigError, TrackingCfg
from tasks.measure.machine import alive
from tasks.worker.heap import imports_uncollected

MAX_PARAMS, MAX_METRICS, MAX_TAG = 100, 1000, 5000  # MLflow's per-batch and per-value limits


def resolve_uri(cfg: TrackingCfg) -> str:
    return cfg.uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


UI_PORT = 5000  # where `mlflow ui` serves a local store (its default port, said explicitly)


def ui_base(uri: str) -> str | None:
    """Where the MLflow UI of a tracking store is browsed: the server itself, or the
    `mlflow ui` that ui_command starts on a local store; None for a store it cannot tell."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    if uri.startswith(("sqlite:", "file:", "/")) or "://" not in uri:
        return f"http://127.0.0.1:{UI_PORT}"
    return None


def ui_command(uri: str, experiment_id: str | None = None) -> str:
    """What to run (a local store) or open (a server: the runs table, when the experiment is known)."""
    if uri.startswith(("http://", "https://")):
        return f"open {ui_links(uri, experiment_id).get('runs', uri)}"
    return f"mlflow ui --backend-store-uri {uri} --port {UI_PORT}"


RUNS_ORDER = "orderByKey=metrics.%60latency_ms_median%60&orderByAsc=true"  # fastest first, flat


def ui_links(uri: str, experiment_id: str | None, run_id: str | None = None) -> dict[str, str]:
    """Direct links into MLflow 3.17's UI that skip the experiment's GenAI overview (where a
    fresh browser lands otherwise): "runs", the experiment's runs table (route
    /experiments/:experimentId/runs), sorted by median latency: sorted by anything but the
    start time the table lists child runs flat rather than folded under their sweep's run;
    and "run", the sweep's run (/experiments/:experimentId/runs/:runUuid). Empty when the
    store's UI is unknown."""
    base = ui_base(uri)
    if base is None or not experiment_id:
        return {}
    links = {"runs": f"{base}/#/experiments/{experiment_id}/runs?{RUNS_ORDER}"}
    if run_id:
        links["run"] = f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
    return links


def ui_lines(uri: str, experiment_id: str | None, run_id: str | None = None) -> list[str]:
    """The lines the sweep prints with ui_links (a local store: once `mlflow ui` runs)."""
    links = ui_links(uri, experiment_id, run_id)
    if not links:
        return []
    lines = []
    if not uri.startswith(("http://", "https://")):
        lines.append(f"MLflow UI, once `{ui_command(uri)}` runs:")
    else:
        lines.append("MLflow UI:")
    if "run" in links:
        lines.append(f"  this sweep's run:  {links['run']}")
    lines.append(f"  all runs (table):  {links['runs']}")
    return lines


REACH_TIMEOUT_S = 10.0


def check_reachable(uri: str) -> None:
    """A tracking server must answer within seconds: a clear error naming the address,
    rather than MLflow's minutes of retries and a traceback."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=REACH_TIMEOUT_S).read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return  # it answers; credentials are MLflow's business (MLFLOW_TRACKING_USERNAME/PASSWORD)
        raise ConfigError(f"tracking.uri={uri!r}: the server answered {e.code} on /health") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            f"tracking.uri={uri!r} cannot be reached ({reason}); is the server running "
            "(scripts/mlflow_server.sh) and the address right?"
        ) from None


def refused(uri: str, status: int) -> str:
    """One line for a server that turned the sweep's credentials away (basic auth: 401, a
    wrong or missing password; 403, a user without permission on the experiment)."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if status == 401:
        who = f"user {user!r}" if user and os.environ.get("MLFLOW_TRACKING_PASSWORD") else "no credentials"
        return (
            f"tracking.uri={uri!r} refused {who} (401 not authenticated): set MLFLOW_TRACKING_USERNAME "
            "and MLFLOW_TRACKING_PASSWORD to an account of that server (scripts/mlflow_server.sh keeps "
            "the admin's in its credentials file)"
        )
    return (
        f"tracking.uri={uri!r} refused user {user!r} (403 permission denied): it needs EDIT on "
        "the experiment (tracking.experiment); ask the server's admin"
    )


@contextmanager
def credentials_checked(uri: str) -> Iterator[None]:
    """A server's refusal of the sweep's credentials (401/403) inside becomes refused()'s
    ConfigError: one line, before any work; any other MLflow error passes unchanged."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        status = e.get_http_status_code()
        if status not in (401, 403):
            raise
        raise ConfigError(refused(uri, status)) from None


RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in the driver of a submitted job (ray job submit)


def check_outlives_job(cfg: TrackingCfg) -> None:
    """A sweep submitted as a Ray job runs in a working directory Ray deletes after the job:
    a store inside it (the default sqlite file and artifact folder) would lose every run.
    Such a sweep must record to a tracking server, or to a store outside that directory."""
    if RAY_JOB_ENV not in os.environ:
        return
    uri = resolve_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return  # a server keeps runs and artifacts itself
    job_dir = Path.cwd().resolve()
    stores = {}  # key -> (as given, the folder or file it names), the runs' store first
    for scheme in ("sqlite:///", "file://", ""):
        if uri.startswith(scheme) and (scheme or "://" not in uri):
            stores["tracking.uri"] = (cfg.uri, uri.removeprefix(scheme))
            break
    stores["tracking.artifact_root"] = (cfg.artifact_root, cfg.artifact_root or job_dir / "mlartifacts")
    for key, (given, where) in stores.items():
        path = Path(where).expanduser().resolve()
        if path == job_dir or job_dir in path.parents:
            said = f"{key}={given!r}" if given else f"{key} unset"
            raise ConfigError(
                f"{said} would keep this submitted sweep's runs in {path}, inside the Ray job's working "
                "directory, which Ray deletes after the job; record to a tracking server (tracking=server "
                "tracking.uri=http://HOST:5000, see scripts/mlflow_server.sh) or give a store outside it"
            )


def check_artifact_root(cfg: TrackingCfg) -> Path | None:
    """The local folder new experiments keep artifacts in must be writable."""
    if resolve_uri(cfg).startswith(("http://", "https://")):
        return None
    root = Path(cfg.artifact_root or Path.cwd() / "mlartifacts").expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".phasesweep-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"tracking.artifact_root={str(root)!r} is not a writable folder ({e.strerror or e})") from None
    return root


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Sweeps started at once on one new sqlite store would each run MLflow's schema
    migrations ("table ... already exists") and create the same experiment: one at a time,
    under an exclusive lock on `<store>.lock` beside it."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    lock = Path(uri.removeprefix("sqlite:///") + ".lock")
    try:
        f = lock.open("a")
    except OSError:  # a folder that does not exist: MLflow's own error says so
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def existing_runs(cfg: TrackingCfg) -> dict[str, list[str]]:
    """bench key -> the status tags of the variant runs the tracking store already holds
    with it, oldest first; read only: a store or an experiment that does not exist yet is
    not created (a local sqlite file that does not exist is not even opened, nor MLflow
    imported). A server that cannot be reached is a ConfigError, as for a sweep."""
    uri = resolve_uri(cfg)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return {}
    check_reachable(uri)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    with credentials_checked(uri):
        exp = client.get_experiment_by_name(cfg.experiment)
    if exp is None:
        return {}
    found: dict[str, list[str]] = {}
    runs, token = [], None
    while True:
        page = client.search_runs(
            [exp.experiment_id], "tags.`phasesweep.role` = 'variant'", max_results=5000, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    for run in sorted(runs, key=lambda r: r.info.start_time):
        key = run.data.tags.get("bench_key")
        if key:
            ok = run.data.tags.get("status") == "ok" and run.info.status == "FINISHED"
            found.setdefault(key, []).append("ok" if ok else run.data.tags.get("status", run.info.status.lower()))
    return found


class Tracker:
    """The sweep's tracking store. Its checks (a store that outlives a submitted job, a server
    that answers, an artifact root it may write) run when it is made; the connection itself
    (importing MLflow and opening the store, or making a new one: seconds) runs in a thread of
    its own when `background` is set and the store is local, beside a local Ray's start, and
    `client` and `experiment_id` wait for it (raising what it raised)."""

    def __init__(self, cfg: TrackingCfg, background: bool = False):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # seconds, not minutes, when a server goes away
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        # not MLflow's "View run/experiment at" line on every ended run: stdout is the sweep's,
        # and the experiment's link lands on the GenAI overview (ui_lines prints the right ones)
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        check_outlives_job(cfg)
        self.uri = resolve_uri(cfg)
        check_reachable(self.uri)
        root = check_artifact_root(cfg)
        self._client: Any = None
        self._experiment_id: str | None = None
        self._error: BaseException | None = None
        self._connecting: threading.Thread | None = None
        # a server's refusal of the credentials is a config error, said before any work: only
        # a local store (sqlite, a folder) is opened in the background
        if background and not self.uri.startswith(("http://", "https://")):
            self._connecting = threading.Thread(target=self._connect, args=(cfg, root), name="tracker-connect", daemon=True)
            self._connecting.start()
        else:
            self._connect(cfg, root)
            self._raise()

    def _connect(self, cfg: TrackingCfg, root: Path | None) -> None:
        try:
            with imports_uncollected():  # MLflow's import and a new store's migrations make objects to keep (tasks/worker/heap.py)
                # imported before the store's lock: a sweep waiting on it never waits on our import
                from mlflow.tracking import MlflowClient

                with _store_lock(self.uri), credentials_checked(self.uri):  # a new store is made now
                    # each call whole: a Ctrl-C waits for the write in flight (orchestrator.common.signals)
                    self._client = Deferring(MlflowClient(tracking_uri=self.uri))
                    self._experiment_id = self._experiment(cfg.experiment, root)
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

    def _experiment(self, name: str, root: Path | None) -> str:
        """The experiment's id, created when new. Sweeps started at once on a server (the
        lock covers sqlite only) race to create it: those that lose take the winner's (3 of
        32 such sweeps failed with RESOURCE_ALREADY_EXISTS before)."""
        from mlflow.exceptions import MlflowException

        exp = self._client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self._client.create_experiment(name, artifact_location=root.as_uri() if root else None)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS" or (exp := self._client.get_experiment_by_name(name)) is None:
                raise
            return exp.experiment_id

    # -- what earlier sweeps left ---------------------------------------------------------
    def search(self, filter_string: str) -> list[Any]:
        """Every run of the experiment matching the filter, all pages."""
        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string, max_results=5000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def finished_ok(self) -> dict[str, Any]:
        """bench key -> the latest variant run that ended ok with it."""
        found: dict[str, Any] = {}
        runs = self.search("tags.`phasesweep.role` = 'variant' and tags.status = 'ok' and attributes.status = 'FINISHED'")
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
    ) -> None:
        """Everything in as few calls as MLflow's batch limits allow."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        m = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
        p = [Param(k, str(v)[:MAX_TAG]) for k, v in (params or {}).items()]
        t = [RunTag(k, str(v)[:MAX_TAG]) for k, v in (tags or {}).items()]
        while m or p or t:
            self.client.log_batch(run_id, metrics=m[:MAX_METRICS], params=p[:MAX_PARAMS], tags=t[:MAX_PARAMS])
            m, p, t = m[MAX_METRICS:], p[MAX_PARAMS:], t[MAX_PARAMS:]

    def artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def artifact_uri(self, run_id: str) -> str:
        """Where a run's artifacts are stored (runs:/ URIs do not reach across runs in the UI)."""
        return self.client.get_run(run_id).info.artifact_uri

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)

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
        self.client.log_text(run_id, json.dumps(obj, indent=indent, default=str), name)

    def log_table(self, run_id: str, rows: list[dict[str, Any]], name: str) -> None:
        """Rows as an MLflow table (the UI's artifact view shows it as one), every cell text."""
        if rows:
            columns = {c: [str(r.get(c, "")) for r in rows] for c in rows[0]}
            self.client.log_table(run_id, data=columns, artifact_file=name)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def log_failure(self, run_id: str, stage: str, error: str, traceback: str) -> None:
        self.log(run_id, tags={"status": "failed", "failure_stage": stage, "error": error})
        if traceback:
            self.log_text(run_id, traceback, "error.txt")


