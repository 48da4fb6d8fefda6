"""Links into the MLflow UI of a tracking store, as the sweep prints them."""

from __future__ import annotations

from orchestrator.record.store import is_server

UI_PORT = 5000  # where `mlflow ui` serves a local store (its default port, said explicitly)
# sorted by anything but start time, the runs table lists child runs flat, not folded under their sweep
RUNS_ORDER = "orderByKey=metrics.%60latency_ms_median%60&orderByAsc=true"


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
    "runs", the experiment's runs table, fastest first; "run", the sweep's run."""
    base = ui_base(uri)
    if base is None or not experiment_id:
        return {}
    links = {"runs": f"{base}/#/experiments/{experiment_id}/runs?{RUNS_ORDER}"}
    if run_id:
        links["run"] = f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
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
