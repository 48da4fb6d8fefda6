"""What the sweep prints: the plan, progress lines, and the summary table."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from orchestrator.common.outcome import Outcome, Status
from tasks.specs import PAST


def say(msg: str) -> None:
    """One line of the driver's output, through the "phasesweep" logger: conf/hydra/job_logging/
    prints it as is on stdout and writes it to the run's (or sweep's) log file."""
    logging.getLogger("phasesweep").info(msg)


def shapes_text(shapes: dict[str, list[int]]) -> str:
    """input_ids[1,128] | input_ids[1,1] pos[1] kv 4x[1,2,136,16]."""

    def dims(s: list[int]) -> str:
        return "[" + ",".join(map(str, s)) + "]"

    past = [s for n, s in shapes.items() if n.startswith(PAST)]
    parts = [f"{'pos' if n == 'cache_position' else n}{dims(s)}" for n, s in shapes.items() if not n.startswith(PAST)]
    if past:
        parts.append(f"kv {len(past)}x{dims(past[0])}")
    return " ".join(parts)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def status_text(o: Outcome) -> str:
    if o.status == Status.OK:
        spread = o.metrics.get("latency_iqr_rel", 0.0)
        machine = o.metrics.get("machine_probe_iqr_rel")  # tasks/measure/bench.py: the machine's own speed
        why = f"iqr {spread:.0%}" + (f"; machine speed iqr {machine:.0%}" if machine is not None else "")
        text = f"ok, unstable ({why})" if o.unstable else "ok"
        return text + (f", reused from run {o.reused_from[:8]}" if o.reused_from else "")
    if o.status == Status.FAILED:
        return f"FAILED {o.stage}: {fold(o.error or '')}"
    if o.status in (Status.SKIPPED, Status.ABORTED):
        return f"{o.status}: {fold(o.error or '')}"
    return str(o.status)


def fold(text: str, width: int = 120) -> str:
    """One line for the table: the first line of a message, cut at `width`."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 3] + "..."


def parity_text(m: dict[str, float]) -> str:
    if "parity_max_abs_diff" not in m:
        return "-"
    steps = int(m.get("parity_steps", 1))
    return f"{m['parity_max_abs_diff']:.1e} ({steps} step{'s' if steps > 1 else ''})"


def summary_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [
        {
            "variant": o.name,
            "inputs": shapes_text(o.shapes) or "-",
            "median_ms": _fmt(o.metrics.get("latency_ms_median"), ".3f"),
            "p90_ms": _fmt(o.metrics.get("latency_ms_p90"), ".3f"),
            "tokens_per_s": _fmt(o.metrics.get("tokens_per_s"), ",.0f"),
            "parity_max_diff": parity_text(o.metrics),
            "status": status_text(o),
        }
        for o in outcomes
    ]


def plan_text(plan: Any, existing: dict[str, list[str]] | None = None, resume: bool = True) -> str:
    """The dry run's view of a plan: every variant with its benchmark's resources and the
    runs the tracking store already holds for it (`existing`: bench key -> their statuses;
    with tracking.resume one that ended ok is reused, not measured again), every export
    job with its own resources and the variants it serves, every skipped combination with
    its reason, every point the grid's rules excluded with its rule."""
    existing = existing or {}

    def runs(pv: Any) -> str:
        if not existing:
            return "0"
        found = existing.get(pv.variant.bench_key, [])
        ok = found.count("ok")
        text = f"{len(found)}" + (f" ({ok} ok)" if ok else "")
        return text + (", reused" if ok and resume else "")

    rows = [
        {
            "variant": pv.name,
            "export": pv.export_key[:12],
            "bench_resources": _resources(pv.request),
            "runs": runs(pv),
            "note": pv.unplaceable or pv.warning or "",
        }
        for pv in plan.variants
    ]
    exports = [
        {
            "export": key[:12],
            "format": job.spec.export_format,
            "resources": _resources(job.request),
            "serves": len(job.variants),
        }
        for key, job in plan.exports.items()
    ]
    skipped = [{"skipped": s.key, "reason": s.reason} for s in plan.skipped]
    excluded = [{"excluded": e.key, "rule": e.rule} for e in getattr(plan, "excluded", ())]
    parts = (
        [table(rows), table(exports)] + ([table(skipped)] if skipped else []) + ([table(excluded)] if excluded else [])
    )
    return "\n\n".join(parts)


def _resources(request: Any) -> str:
    opts = request.options
    parts = [f"cpu={opts.get('num_cpus', 0):g}"]
    if opts.get("num_gpus"):
        parts.append(f"gpu={opts['num_gpus']:g}")
    if opts.get("memory"):
        parts.append(f"mem={opts['memory'] / 2**30:.1f}GiB")
    parts += [f"{k}={v:g}" for k, v in opts.get("resources", {}).items()]
    return " ".join(parts) + f" [{request.pool}]"


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no variants)"
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    right = {"median_ms", "p90_ms", "tokens_per_s", "app_forward_ms", "app_inter_token_ms"}

    def line(r: dict[str, Any]) -> str:
        return "  ".join(str(r[c]).rjust(width[c]) if c in right else str(r[c]).ljust(width[c]) for c in cols).rstrip()

    header = {c: c for c in cols}
    return "\n".join([line(header), "  ".join("-" * width[c] for c in cols), *map(line, rows)])


def latency_plot(outcomes: list[Outcome], path: str) -> bool:
    """The latency plot alone (orchestrator.read.plots.latency_plot) at `path`; False when
    nothing was measured."""
    from orchestrator.read.plots import _matplotlib, measured
    from orchestrator.read.plots import latency_plot as draw

    rows = measured(plot_rows(outcomes))
    if not rows:
        return False
    _matplotlib()
    return draw(rows, Path(path))


# -- what the plots and the report are drawn from --------------------------------------------
PLOT_PARAMS = ("phase.context_len",)  # the params a plot needs beyond the axes


def plot_row(o: Outcome, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One variant as orchestrator.read.plots draws it (a plain dict, the same from a sweep's
    outcomes and from MLflow runs)."""
    return {
        "name": o.name,
        **{k: o.axes.get(k, "") for k in ("model", "phase", "backend", "device")},
        "status": str(o.status),
        "unstable": o.unstable,
        "params": {k: str(v) for k, v in (params or {}).items() if k in PLOT_PARAMS},
        "metrics": dict(o.metrics),
    }


def plot_rows(outcomes: list[Outcome], params: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`params`: variant name -> its flattened config (Variant.params or an MLflow run's)."""
    return [plot_row(o, (params or {}).get(o.name)) for o in outcomes]


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """summary_rows as a markdown (GitHub, MLflow description) table."""
    if not rows:
        return "(no variants)"
    cols = list(rows[0])
    right = {"median_ms", "p90_ms", "tokens_per_s", "app_forward_ms", "app_inter_token_ms"}
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if c in right else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(_md_cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def sweep_note(command: str | None, rows: list[dict[str, Any]], limit: int = 5000) -> str:
    """The sweep run's description (tag mlflow.note.content): its command and its summary
    table in markdown, cut to whole rows under `limit` characters."""
    head = (f"**Command:** `{command}`\n\n" if command else "") + "**Summary**\n\n"
    for n in range(len(rows), -1, -1):
        more = len(rows) - n
        tail = f"\n\n... {more} more variant(s): see summary.txt" if more else ""
        text = head + (markdown_table(rows[:n]) if n else "") + tail
        if len(text) <= limit:
            return text
    return head[:limit]


# -- the report of an earlier sweep, from MLflow alone ----------------------------------------
class ReportError(Exception):
    """A reference that names no sweep; the CLI exits 2 with the message."""


def _client(uri: str):
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bars on stderr
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _search(client, experiment_ids: list[str], filter_string: str, order_by: list[str] | None = None) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, order_by=order_by, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


SWEEP_FILTER = "tags.`phasesweep.role` = 'sweep'"


def find_sweep(client, ref: str) -> Any:
    """The sweep run `ref` names: a run id, an experiment name (its latest sweep), or
    `latest` (the latest sweep of any experiment)."""
    from mlflow.exceptions import MlflowException

    def latest(experiment_ids: list[str], where: str) -> Any:
        runs = client.search_runs(experiment_ids, SWEEP_FILTER, max_results=1, order_by=["attributes.start_time DESC"])
        if not runs:
            raise ReportError(f"no sweep run in {where}")
        return runs[0]

    if ref == "latest":
        ids = [e.experiment_id for e in client.search_experiments()]
        return latest(ids, "any experiment of this tracking store") if ids else latest([], "an empty store")
    exp = client.get_experiment_by_name(ref)
    if exp is not None:
        return latest([exp.experiment_id], f"experiment {ref!r}")
    try:
        run = client.get_run(ref)
    except MlflowException:
        raise ReportError(f"{ref!r} is neither a run id nor an experiment name in this tracking store") from None
    if run.data.tags.get("phasesweep.role") != "sweep":
        role = run.data.tags.get("phasesweep.role", "not a phasesweep run")
        raise ReportError(f"run {ref} ({run.info.run_name}) is not a sweep run ({role}); pass its parent run's id")
    return run


def _artifact_json(client, run_id: str, name: str) -> Any:
    import tempfile

    if name not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(Path(client.download_artifacts(run_id, name, tmp)).read_text())


def outcome_of_run(run: Any, name: str | None = None, reused_from: str | None = None) -> Outcome:
    """A variant's run as the sweep's Outcome of it (what the table and plots show); `name`:
    the name the sweep gave a run it reused (an earlier sweep's name may differ)."""
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


def load_sweep(client, parent: Any) -> tuple[list[Outcome], dict[str, dict[str, Any]]]:
    """The sweep's outcomes (its child runs and the runs it reused, by the parent's
    reused.json), in the order its summary.json listed them, and each variant's params."""
    pid = parent.info.run_id
    kids = _search(client, [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{pid}'")
    kids.sort(key=lambda r: (r.info.start_time, r.info.run_name))
    found = [(r.info.run_name, r, None) for r in kids]
    for name, run_id in (_artifact_json(client, pid, "reused.json") or {}).items():
        found.append((name, client.get_run(run_id), run_id))
    order: dict[str, int] = {}
    for i, row in enumerate(_artifact_json(client, pid, "summary.json") or []):
        order.setdefault(row.get("variant"), i)
    found.sort(key=lambda f: order.get(f[0], len(order)))  # stable: the start time breaks ties
    outcomes = [outcome_of_run(run, name, reused) for name, run, reused in found]
    return outcomes, {name: dict(run.data.params) for name, run, _ in found}


def _html(parent: Any, rows: list[dict[str, Any]], plots: list[Path]) -> str:
    import base64
    import html

    cols = list(rows[0]) if rows else []
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows)
    imgs = "".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in plots
    )
    name, command = parent.info.run_name, parent.data.params.get("command", "")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>phasesweep report: {html.escape(name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}
th{{background:#f3f3f3}}img{{max-width:100%}}figure{{margin:2em 0}}code{{background:#f3f3f3;padding:2px 4px}}</style>
</head><body>
<h1>phasesweep report: {html.escape(name)}</h1>
<p>Sweep run <code>{parent.info.run_id}</code>, status {html.escape(parent.data.tags.get("status", parent.info.status))}<br>
Command: <code>{html.escape(command)}</code></p>
<h2>Summary</h2>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<h2>Plots</h2>
{imgs or "<p>(nothing measured)</p>"}
</body></html>
"""


def report(uri: str, ref: str, fmt: str = "markdown", out: Path | None = None) -> str:
    """The report of sweep `ref` in `fmt` (markdown, csv, html, text); the markdown's plots
    are written next to `out` (or in the current folder), the html embeds them."""
    import tempfile

    client = _client(uri)
    parent = find_sweep(client, ref)
    outcomes, params = load_sweep(client, parent)
    rows = summary_rows(outcomes)
    if fmt == "text":
        return table(rows) + "\n"
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["variant"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    prows = plot_rows(outcomes, params)
    from orchestrator.read.plots import make_plots

    if fmt == "html":
        with tempfile.TemporaryDirectory() as tmp:
            return _html(parent, rows, make_plots(prows, tmp))
    base = (out.parent if out else Path.cwd()) / f"{out.stem if out else parent.info.run_name}_plots"
    plots = make_plots(prows, base)
    rel = base.name
    command = parent.data.params.get("command")
    lines = [f"# phasesweep report: {parent.info.run_name}", "", f"- sweep run: `{parent.info.run_id}`"]
    lines += [f"- command: `{command}`"] if command else []
    lines += ["", markdown_table(rows), ""]
    lines += [f"![{p.stem}]({rel}/{p.relative_to(base).as_posix()})" for p in plots]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from orchestrator.plan.config import TrackingCfg
    from orchestrator.record.store import resolve_uri

    ap = argparse.ArgumentParser(
        prog="python -m orchestrator.read.report",
        description="Rebuild the summary table and plots of an earlier sweep from MLflow alone.",
    )
    ap.add_argument("ref", help="the sweep's run id, an experiment name (its latest sweep), or 'latest'")
    ap.add_argument("--uri", help="tracking URI (default: sqlite:///$PWD/mlflow.db)")
    ap.add_argument("--format", choices=("markdown", "csv", "html", "text"), default="markdown")
    ap.add_argument("--out", type=Path, help="write here instead of stdout (markdown: the plots go next to it)")
    args = ap.parse_args(argv)
    uri = args.uri or resolve_uri(TrackingCfg())
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        print(f"error: no MLflow store at {uri} (run from the sweep's folder or pass --uri)", file=sys.stderr)
        return 2
    try:
        text = report(uri, args.ref, args.format, args.out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
