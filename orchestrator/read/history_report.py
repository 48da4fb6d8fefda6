"""`python -m orchestrator.report --history [EXPERIMENT]`: each variant across the sweeps of an
experiment (orchestrator/read/history.py), as text, markdown, csv or html, with its plot; the
plot, the table and the changes are logged on the experiment's latest sweep run, under history/."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.common.console import table
from orchestrator.read.history import change_lines, history_of, history_rows, plot_title, sweeps_text
from orchestrator.read.history_plot import NAME, history_plot
from orchestrator.read.report_build import csv_text, page
from orchestrator.read.store import open_store
from orchestrator.read.summary import markdown_table

FOLDER = "history"  # on the latest sweep run


def history_report(uri: str | None, experiment: str, fmt: str = "markdown", out: Path | None = None, order: str = "time") -> str:
    """The history of `experiment` in `fmt`; its plot (markdown: next to `out`, html: embedded),
    table and changes logged on its latest sweep run."""
    client = open_store(uri)
    sweeps, series = history_of(client, experiment, order)
    rows, changes = history_rows(series), change_lines(series)
    latest = max(sweeps, key=lambda s: s.info.start_time)
    with tempfile.TemporaryDirectory() as tmp:
        drawn = history_plot(series, Path(tmp) / NAME, plot_title(experiment, sweeps, series, order))
        log(client, latest.info.run_id, rows, changes, Path(tmp) / NAME if drawn else None)
        if fmt == "html":
            return page(f"history of {experiment}", [sweeps_text(sweeps, series, order), *changes], rows,
                        [Path(tmp) / NAME] if drawn else [])  # fmt: skip
        if fmt == "markdown" and drawn:
            base = (out.parent if out else Path.cwd()) / f"{out.stem if out else experiment}_history.png"
            base.write_bytes((Path(tmp) / NAME).read_bytes())
    if fmt == "text":
        return table(rows) + "\n\n" + "\n".join(changes) + "\n"
    if fmt == "csv":
        return csv_text(rows)
    lines = [f"# phasesweep history: {experiment}", "", f"- {sweeps_text(sweeps, series, order)}", ""]
    lines += [markdown_table(rows), "", *(f"    {c}" for c in changes), ""]
    lines += [f"![history]({base.name})"] if drawn else []
    return "\n".join(lines) + "\n"


def log(client: Any, run_id: str, rows: list[dict[str, str]], changes: list[str], plot: Path | None) -> None:
    """The history on the sweep run `run_id`: history/history.png, history.txt, history.json."""
    client.log_text(run_id, table(rows) + "\n\n" + "\n".join(changes) + "\n", f"{FOLDER}/history.txt")
    client.log_text(run_id, json.dumps({"rows": rows, "changes": changes}, indent=1), f"{FOLDER}/history.json")
    if plot is not None:
        client.log_artifact(run_id, str(plot), FOLDER)
