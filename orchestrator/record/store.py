"""Where a sweep's runs are kept, and the checks that it can keep them there, made before any work."""

from __future__ import annotations

import base64
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.plan.checks import check_writable
from orchestrator.plan.config import ConfigError, TrackingCfg

REACH_TIMEOUT_S = 10.0
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in the driver of a submitted job (ray job submit)


@dataclass(frozen=True)
class Store:
    """Where a sweep's runs are kept, checked before any work (tracking.*): the Tracker's one input."""

    uri: str
    experiment: str
    artifact_root: Path | None  # a local store's artifact folder for new experiments, writable; None for a server
    journal: Path | None  # a server's journal of writes (orchestrator/record/journal.py); None for a local store
    outage_s: float  # how long a server may be away before the sweep stops

    @classmethod
    def checked(cls, cfg: TrackingCfg) -> Store:
        """ConfigError, naming the key, for a store the sweep cannot keep its runs in."""
        check_outlives_job(cfg)
        uri = resolve_uri(cfg)
        check_reachable(uri)
        journal = journal_path(cfg) if is_server(uri) else None
        return cls(uri, cfg.experiment, check_artifact_root(cfg), journal, cfg.outage_s)


def journal_path(cfg: TrackingCfg) -> Path:
    """This sweep's journal of writes to a server: in tracking.journal_dir, else .phasesweep_journal
    here, or in the system temp folder when here is a Ray job's working folder (deleted after it)."""
    if cfg.journal_dir:
        folder = Path(cfg.journal_dir).expanduser()
    elif RAY_JOB_ENV in os.environ:
        folder = Path(tempfile.gettempdir()) / f"phasesweep-journal-{os.getuid()}"
    else:
        folder = Path.cwd() / ".phasesweep_journal"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return folder.resolve() / f"sweep-{stamp}-{os.getpid()}.jsonl"


def resolve_uri(cfg: TrackingCfg) -> str:
    return cfg.uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def quick_http() -> None:
    """MLflow's HTTP client gives up in seconds, not minutes, when a server goes away."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def check_reachable(uri: str) -> None:
    """A tracking server must answer /health: a one-line error naming it, not MLflow's retries."""
    if not is_server(uri):
        return
    # lazy: urllib.request loads ssl, and `sweep.py --help` imports this module
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=REACH_TIMEOUT_S).read()
    except urllib.error.HTTPError as e:
        if e.code not in (401, 403):  # 401/403: it answers, and the credentials are tried below
            raise ConfigError(f"tracking.uri={uri!r}: the server answered {e.code} on /health") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            f"tracking.uri={uri!r} cannot be reached ({reason}); is the server running "
            "(scripts/mlflow_server.sh) and the address right?"
        ) from None
    check_credentials(uri)


def check_credentials(uri: str) -> None:
    """The credentials MLflow will send, tried on one small read now, so a server that refuses
    them is refused()'s one line before any work; EDIT on the experiment is met on the first write."""
    # lazy: urllib.request loads ssl, and `sweep.py --help` imports this module
    import urllib.error
    import urllib.request

    search = urllib.request.Request(
        uri.rstrip("/") + "/api/2.0/mlflow/experiments/search", data=b'{"max_results": 1}', method="POST",
        headers={"Content-Type": "application/json", **auth_header()},
    )  # fmt: skip
    try:
        urllib.request.urlopen(search, timeout=REACH_TIMEOUT_S).read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise ConfigError(refused(uri, e.code)) from None
    except (OSError, ValueError):
        pass  # it answered /health just now; MLflow's own calls report what goes wrong next


def auth_header() -> dict[str, str]:
    """The Authorization MLflow's client sends from the environment: a user and password, else a token."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def refused(uri: str, status: int) -> str:
    """One line for a server that turned the credentials away: 401 wrong or missing, 403 no permission."""
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
    """A 401/403 from MLflow inside becomes refused()'s ConfigError; other errors pass unchanged."""
    from mlflow.exceptions import MlflowException  # lazy: mlflow, only once a store is opened

    try:
        yield
    except MlflowException as e:
        status = e.get_http_status_code()
        if status not in (401, 403):
            raise
        raise ConfigError(refused(uri, status)) from None


def check_outlives_job(cfg: TrackingCfg) -> None:
    """A sweep submitted as a Ray job runs in a folder Ray deletes after the job: its store
    (the sqlite file, the artifact folder) must be a server or lie outside that folder."""
    if RAY_JOB_ENV not in os.environ:
        return
    uri = resolve_uri(cfg)
    if is_server(uri):
        return
    job_dir = Path.cwd().resolve()
    stores = {}  # key -> (as given, the folder or file it names)
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
    """The local folder new experiments keep artifacts in, checked writable; None for a server."""
    if is_server(resolve_uri(cfg)):
        return None
    return check_writable("tracking.artifact_root", cfg.artifact_root or Path.cwd() / "mlartifacts")


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """One sweep at a time opens a sqlite store (an exclusive lock on `<store>.lock`): sweeps
    started at once on a new one would each run MLflow's schema migrations and fail."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    lock = Path(uri.removeprefix("sqlite:///") + ".lock")
    try:
        f = lock.open("a")
    except OSError:  # a folder that does not exist: MLflow's own error says so
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
