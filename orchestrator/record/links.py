"""Links into the MLflow UI of a tracking store, as the sweep prints them, and the experiment
tags that make the UI open on the numbers (MLflow 3.17's UI reads both)."""

from __future__ import annotations

import json

from orchestrator.record.store import is_server

UI_PORT = 5000  # where `mlflow ui` serves a local store (its default port, said explicitly)
# the classic runs-and-metrics view, not the GenAI one a fresh browser opens: by URL, and by the tag
CLASSIC = "workflowType=machine_learning"
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
# a view the UI's "share view" keeps as an experiment tag, opened by its key in the URL: the runs
# sorted by latency (then listed flat, not folded under their sweep), the figures as columns
VIEW_KEY = "phasesweep"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
COLUMNS = (
    "metrics.`latency_ms_median`",
    "metrics.`tokens_per_s`",
    "metrics.`parity_max_abs_diff`",
    "metrics.`quality_ppl_increase`",
    "metrics.`quality_kl`",
    "tags.`status`",
)


def experiment_tags() -> dict[str, str]:
    """What the sweep sets on its experiment: the classic view, and the runs table's columns and order."""
    view = {"orderByKey": "metrics.`latency_ms_median`", "orderByAsc": True, "selectedColumns": list(COLUMNS)}
    return {KIND_TAG: KIND, VIEW_TAG: json.dumps(view)}


def ui_base(uri: str) -> str | None:
    """The server itself, or the `mlflow ui` ui_command starts on a local store; None when unknown."""
    if is_server(uri):
        return uri.rstrip("/")
    if uri.startswith(("sqlite:", "file:", "/")) or "://" not in uri:
        return f"http://127.0.0.1:{UI_PORT}"
    return None


def ui_command(uri: str, experiment_id: str | None = None) -> str:
    """What to run (a local store) or open (a server: the runs table, when the experiment is known)."""
    if is_server(uri):
        return f"open {ui_links(uri, experiment_id).get('runs', uri)}"
    return f"mlflow ui --backend-store-uri {uri} --port {UI_PORT}"


def ui_links(uri: str, experiment_id: str | None, run_id: str | None = None) -> dict[str, str]:
    """Direct routes of MLflow's UI, past the GenAI overview a fresh browser lands on otherwise:
    "runs", the experiment's runs table in its view (experiment_tags), fastest first; "run", the sweep's run."""
    base = ui_base(uri)
    if base is None or not experiment_id:
        return {}
    links = {"runs": f"{base}/#/experiments/{experiment_id}/runs?{CLASSIC}&viewStateShareKey={VIEW_KEY}"}
    if run_id:
        links["run"] = f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{CLASSIC}"
    return links


def ui_lines(uri: str, experiment_id: str | None, run_id: str | None = None) -> list[str]:
    """The lines the sweep prints with ui_links."""
    links = ui_links(uri, experiment_id, run_id)
    if not links:
        return []
    lines = ["MLflow UI:" if is_server(uri) else f"MLflow UI, once `{ui_command(uri)}` runs:"]
    if "run" in links:
        lines.append(f"  this sweep's run:  {links['run']}")
    lines.append(f"  all runs (table):  {links['runs']}")
    return lines
