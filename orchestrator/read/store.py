"""Earlier sweeps read back from MLflow: the sweep a reference names, and its variants' runs."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.common.outcome import Outcome, Status
from orchestrator.plan.config import TrackingCfg
from orchestrator.record.store import resolve_uri
from orchestrator.record.tracking import run_series

SWEEP_FILTER = "tags.`phasesweep.role` = 'sweep'"


class UsageError(Exception):
    """A store, reference or request that names nothing to read: the CLIs exit 2 with it."""


def store_uri(uri: str | None = None) -> str:
    """The tracking URI compare and report read: `uri`, else the sweep's own ./mlflow.db."""
    return uri or resolve_uri(TrackingCfg())


def open_store(uri: str | None = None) -> Any:
    """An MlflowClient of `uri` (default: the sweep's own ./mlflow.db), which must exist."""
    uri = store_uri(uri)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise UsageError(f"no MLflow store at {uri} (run from the sweep's folder or pass --uri)")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # else a bar per download
    from mlflow.tracking import MlflowClient  # lazy: mlflow, only once a store is opened

    return MlflowClient(tracking_uri=uri)


def _search(client: Any, experiment_ids: list[str], filter_string: str) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def latest_sweeps(client: Any, experiment_ids: list[str], count: int = 2) -> list[Any]:
    """The last `count` sweep runs of these experiments, oldest first."""
    runs = client.search_runs(experiment_ids, SWEEP_FILTER, max_results=count, order_by=["attributes.start_time DESC"])
    return list(reversed(runs))


def find_sweep(client: Any, ref: str) -> Any:
    """The sweep run `ref` names: an experiment name (its latest sweep), a run id, or `latest`
    (the latest sweep of any experiment)."""
    from mlflow.exceptions import MlflowException  # lazy: mlflow, only once a store is opened

    def latest(experiment_ids: list[str], where: str) -> Any:
        runs = latest_sweeps(client, experiment_ids, 1) if experiment_ids else []
        if not runs:
            raise UsageError(f"no sweep run in {where}")
        return runs[0]

    if ref == "latest":
        return latest([e.experiment_id for e in client.search_experiments()], "any experiment of this tracking store")
    exp = client.get_experiment_by_name(ref)
    if exp is not None:
        return latest([exp.experiment_id], f"experiment {ref!r}")
    try:
        run = client.get_run(ref)
    except MlflowException:
        raise UsageError(f"{ref!r} is neither a run id nor an experiment name in this tracking store") from None
    if run.data.tags.get("phasesweep.role") != "sweep":
        role = run.data.tags.get("phasesweep.role", "not a phasesweep run")
        raise UsageError(f"run {ref} ({run.info.run_name}) is not a sweep run ({role}); pass its parent run's id")
    return run


def artifact_json(client: Any, run_id: str, name: str) -> Any:
    """A run's JSON artifact (`captures/x.json`: in its folder), or None when it has none."""
    folder = Path(name).parent.as_posix()
    if name not in {a.path for a in client.list_artifacts(run_id, None if folder == "." else folder)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(Path(client.download_artifacts(run_id, name, tmp)).read_text())


def variant_runs(client: Any, parent: Any) -> list[tuple[str, Any, str | None]]:
    """(name, run, reused run id or None) of a sweep's variants: its child runs and the earlier
    runs it reused (reused.json), in the order its summary.json lists them."""
    pid = parent.info.run_id
    kids = _search(client, [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{pid}'")
    kids.sort(key=lambda r: (r.info.start_time, r.info.run_name))
    found = [(r.info.run_name, r, None) for r in kids]
    for name, run_id in (artifact_json(client, pid, "reused.json") or {}).items():
        found.append((name, client.get_run(run_id), run_id))
    order: dict[str, int] = {}
    for i, row in enumerate(artifact_json(client, pid, "summary.json") or []):
        order.setdefault(row.get("variant"), i)
    found.sort(key=lambda f: order.get(f[0], len(order)))  # stable: the start time breaks ties
    return found


def outcome_of_run(run: Any, name: str | None = None, reused_from: str | None = None) -> Outcome:
    """A variant's run as the sweep's Outcome of it; `name`: the sweep's name for a run it reused."""
    tags, params = run.data.tags, run.data.params
    status = tags.get("status", Status.PLANNED)
    error = tags.get("skip_reason") if status == Status.SKIPPED else tags.get("error")
    return Outcome(
        name or run.info.run_name,
        Status(status) if status in {s.value for s in Status} else Status.PLANNED,
        run.info.run_id,
        {k: tags.get(k, "") for k in ("model", "phase", "backend", "device")},
        shapes={k.removeprefix("shape."): json.loads(v) for k, v in params.items() if k.startswith("shape.")},
        metrics=dict(run.data.metrics),
        stage=tags.get("failure_stage"),
        error=error,
        unstable=tags.get("unstable") == "True",
        reused_from=reused_from,
    )


def load_sweep(client: Any, parent: Any) -> tuple[list[Outcome], dict[str, dict[str, Any]]]:
    """A sweep's outcomes, in its summary's order, and each variant's params."""
    found = variant_runs(client, parent)
    outcomes = [outcome_of_run(run, name, reused) for name, run, reused in found]
    for o, (_, run, _) in zip(outcomes, found, strict=True):
        o.series = run_series(client, run)
    return outcomes, {name: dict(run.data.params) for name, run, _ in found}
