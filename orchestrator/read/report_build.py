"""The report of an earlier sweep, rebuilt from MLflow alone: markdown, csv, html or text."""

from __future__ import annotations

import base64
import csv
import html
import io
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.common.console import table
from orchestrator.read.curves import curves_text
from orchestrator.read.generation import generation_text, generations
from orchestrator.read.generation_app import ARTIFACT as APP_ARTIFACT
from orchestrator.read.generation_app import app_text
from orchestrator.read.history import change_lines, history_of, plot_title
from orchestrator.read.history_plot import NAME, history_plot
from orchestrator.read.plots import make_plots, plot_rows
from orchestrator.read.store import artifact_json, find_sweep, load_sweep, open_store
from orchestrator.read.summary import markdown_table, summary_rows
from orchestrator.record.revision import revision_lines

FORMATS = ("markdown", "csv", "html", "text")
STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}img{max-width:100%}figure{margin:2em 0}code{background:#f3f3f3;padding:2px 4px}"""


def report(uri: str | None, ref: str, fmt: str = "markdown", out: Path | None = None) -> str:
    """The report of sweep `ref` (store.find_sweep) in `fmt`; markdown writes its plots next to
    `out` (or in the current folder), html embeds them."""
    client = open_store(uri)
    parent = find_sweep(client, ref)
    outcomes, params = load_sweep(client, parent)
    rows = summary_rows(outcomes)
    if fmt == "text":
        return table(rows) + "\n"
    if fmt == "csv":
        return csv_text(rows)
    prows = plot_rows(outcomes, params)
    generated = generation_section(client, parent, prows)
    if fmt == "html":
        with tempfile.TemporaryDirectory() as tmp:
            sections = (f"<h2>Whole generation</h2>\n<pre>{html.escape(generated)}</pre>\n" if generated else "")
            return _html(parent, rows, make_plots(prows, tmp), sections + history_section(client, parent, Path(tmp)))
    base = (out.parent if out else Path.cwd()) / f"{out.stem if out else parent.info.run_name}_plots"
    plots = make_plots(prows, base)
    command = parent.data.params.get("command")
    lines = [f"# phasesweep report: {parent.info.run_name}", "", f"- sweep run: `{parent.info.run_id}`"]
    lines += [f"- command: `{command}`"] if command else []
    lines += [f"- {line}" for line in revision_lines(parent.data.tags)]
    lines += ["", markdown_table(rows), ""]
    if curves := curves_text(outcomes, params):  # depth series, batch sweeps and their knees
        lines += ["```", curves, "```", ""]
    if generated:  # the predicted whole generations, and a captured application's loop beside them
        lines += ["```", generated, "```", ""]
    lines += [f"![{p.stem}]({base.name}/{p.relative_to(base).as_posix()})" for p in plots]
    return "\n".join(lines) + "\n"


def generation_section(client: Any, parent: Any, prows: list[dict[str, Any]]) -> str:
    """The predicted whole generations and, for a captured application, its loop beside them; or ''."""
    gens = generations(prows)
    if not gens:
        return ""
    compared = app_text(artifact_json(client, parent.info.run_id, APP_ARTIFACT) or [])  # as the sweep compared them
    return generation_text(gens) + (f"\n\n{compared}" if compared else "")


def figures(plots: list[Path]) -> str:
    esc = html.escape
    return "".join(
        f'<figure><img alt="{esc(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{esc(p.stem)}</figcaption></figure>'
        for p in plots
    )


def html_table(rows: list[dict[str, Any]]) -> str:
    esc = html.escape
    cols = list(rows[0]) if rows else []
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, intro: list[str], rows: list[dict[str, Any]], plots: list[Path], sections: str = "") -> str:
    """A self-contained html page: title, intro lines, the table, the plots embedded, more `sections`."""
    esc = html.escape
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>phasesweep {esc(title)}</title>
<style>{STYLE}</style>
</head><body>
<h1>phasesweep {esc(title)}</h1>
<p>{"<br>".join(esc(line) for line in intro)}</p>
<h2>Summary</h2>
{html_table(rows)}
<h2>Plots</h2>
{figures(plots) or "<p>(nothing measured)</p>"}
{sections}
</body></html>
"""


def history_section(client: Any, parent: Any, folder: Path) -> str:
    """The History section of a sweep's html report: its experiment's sweeps up to it, drawn
    (orchestrator/read/history.py); empty when no variant has two sweeps yet."""
    experiment = client.get_experiment(parent.info.experiment_id).name
    sweeps, series = history_of(client, experiment, until=parent)
    if not any(len(points) > 1 for points in series.values()):
        return ""
    plot = folder / NAME
    history_plot(series, plot, plot_title(experiment, sweeps, series, "time"))
    changes = "<br>".join(html.escape(line) for line in change_lines(series))
    return f"<h2>History</h2>\n<p>{changes}</p>\n{figures([plot])}"


def _html(parent: Any, rows: list[dict[str, Any]], plots: list[Path], history: str = "") -> str:
    name, command = parent.info.run_name, parent.data.params.get("command", "")
    status = parent.data.tags.get("status", parent.info.status)
    intro = [f"Sweep run {parent.info.run_id}, status {status}", f"Command: {command}", *revision_lines(parent.data.tags)]
    return page(f"report: {name}", intro, rows, plots, history)


def csv_text(rows: list[dict]) -> str:
    """Table rows as CSV, one column per key of the first row."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["variant"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
