"""The sweep's tables: its plan (the dry run's view) and its summary, as text and markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from orchestrator.common.console import RIGHT, fold, table
from orchestrator.common.outcome import Outcome, Status
from tasks.specs import PAST


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
        machine = o.metrics.get("machine_probe_iqr_rel")  # the machine's own speed (tasks/measure/bench.py)
        why = f"iqr {spread:.0%}" + (f"; machine speed iqr {machine:.0%}" if machine is not None else "")
        text = f"ok, unstable ({why})" if o.unstable else "ok"
        return text + (f", reused from run {o.reused_from[:8]}" if o.reused_from else "")
    if o.status == Status.FAILED:
        return f"FAILED {o.stage}: {fold(o.error or '')}"
    if o.status in (Status.SKIPPED, Status.ABORTED):
        return f"{o.status}: {fold(o.error or '')}"
    return str(o.status)


def parity_text(m: dict[str, float]) -> str:
    if "parity_max_abs_diff" not in m:
        return "-"
    steps = int(m.get("parity_steps", 1))
    return f"{parity_value(m)} ({steps} step{'s' if steps > 1 else ''})"


def parity_value(m: dict[str, float]) -> str:
    """The max abs diff; a quantised variant's relative error against the float reference (what it is judged by)."""
    if "parity_rel_error_bound" in m:
        return f"rel {m['parity_max_rel_error']:.2f}"
    return f"{m['parity_max_abs_diff']:.1e}"


REFERENCE = "reference"


def quality_text(m: dict[str, float]) -> str:
    """Against float32 eager on the same tokens: perplexity change (text only), KL, top-1;
    "reference" for a float32, unquantised variant (the reference itself: nothing measured)."""
    if m.get("quality_reference"):
        return REFERENCE
    if "quality_kl" not in m:
        return "-"
    ppl = f"ppl {m['quality_ppl']:.2f} ({m['quality_ppl_increase']:+.2%}), " if "quality_ppl" in m else ""
    return f"{ppl}kl {m['quality_kl']:.1e}, top1 {m['quality_top1']:.0%}"


def bandwidth_text(m: dict[str, float]) -> str:
    """A decode call's achieved memory bandwidth as a share of the roofline (the machine's own read
    bandwidth, or a GPU's peak): "23% of 46 GB/s"."""
    if "bandwidth_share" not in m:
        return "-"
    roof = m.get("peak_bandwidth_gbs") or m.get("machine_read_bandwidth_gbs")
    return f"{m['bandwidth_share']:.0%}" + (f" of {roof:.0f} GB/s" if roof else "")


def summary_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    rows = [
        {
            "variant": o.name,
            "inputs": shapes_text(o.shapes) or "-",
            "median_ms": _fmt(o.metrics.get("latency_ms_median"), ".3f"),
            "p90_ms": _fmt(o.metrics.get("latency_ms_p90"), ".3f"),
            "tokens_per_s": _fmt(o.metrics.get("tokens_per_s"), ",.0f"),
            "parity_max_diff": parity_text(o.metrics),
            "quality": quality_text(o.metrics),
            "bw_share": bandwidth_text(o.metrics),
            "status": status_text(o),
        }
        for o in outcomes
    ]
    if all(r["bw_share"] == "-" for r in rows):  # decode variants only
        for r in rows:
            del r["bw_share"]
    if all(r["quality"] in ("-", REFERENCE) for r in rows):  # a column only when some variant measured it
        for r in rows:
            del r["quality"]
    return rows


def plan_text(plan: Any, existing: dict[str, list[str]] | None = None, resume: bool = True) -> str:
    """Every variant with its resources and the runs the store already holds for it
    (`existing`: bench key -> their statuses), every export job, every skipped and excluded point."""
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
    return "\n\n".join([table(rows), table(exports)] + [table(t) for t in (skipped, excluded) if t])


def _resources(request: Any) -> str:
    opts = request.options
    parts = [f"cpu={opts.get('num_cpus', 0):g}"]
    if opts.get("num_gpus"):
        parts.append(f"gpu={opts['num_gpus']:g}")
    if opts.get("memory"):
        parts.append(f"mem={opts['memory'] / 2**30:.1f}GiB")
    parts += [f"{k}={v:g}" for k, v in opts.get("resources", {}).items()]
    return " ".join(parts) + f" [{request.pool}]"


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no variants)"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if c in RIGHT else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(_md_cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def sweep_note(command: str | None, rows: list[dict[str, Any]], limit: int = 5000, plots: tuple[str, ...] = (),
               run_id: str | None = None) -> str:  # fmt: skip
    """The sweep run's description (tag mlflow.note.content): its command, summary table and
    plots (`plots`: their artifact paths on run `run_id`, shown by the UI's own artifact route) in
    markdown, the table cut to whole rows under `limit` characters."""
    head = (f"**Command:** `{command}`\n\n" if command else "") + "**Summary**\n\n"
    images = "".join(f"\n\n![{Path(p).stem}](get-artifact?path={quote(p)}&run_uuid={run_id})" for p in plots if run_id)
    images = f"\n\n**Plots**{images}" if images else ""
    for n in range(len(rows), -1, -1):
        more = len(rows) - n
        tail = f"\n\n... {more} more variant(s): see summary.txt" if more else ""
        text = head + (markdown_table(rows[:n]) if n else "") + tail + images
        if len(text) <= limit:
            return text
    return head[:limit]
