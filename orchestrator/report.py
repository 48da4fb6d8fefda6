"""What the sweep prints: the plan, progress lines, and the summary table."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.outcome import Outcome, Status
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
        text = f"ok, unstable (iqr {spread:.0%})" if o.unstable else "ok"
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


def plan_text(plan: Any) -> str:
    """The dry run's view of a plan: every variant with its benchmark's resources, every
    export job with its own and the variants it serves, every skipped combination."""
    rows = [
        {
            "variant": pv.name,
            "export": pv.export_key[:12],
            "bench_resources": _resources(pv.request),
            "note": pv.unplaceable or pv.warning or "",
        }
        for pv in plan.variants
    ]
    exports = [
        {"export": key[:12], "format": job.spec.export_format, "resources": _resources(job.request), "serves": len(job.variants)}
        for key, job in plan.exports.items()
    ]
    skipped = [{"skipped": s.key, "reason": s.reason} for s in plan.skipped]
    parts = [table(rows), table(exports)] + ([table(skipped)] if skipped else [])
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
    right = {"median_ms", "p90_ms", "tokens_per_s"}

    def line(r: dict[str, Any]) -> str:
        return "  ".join(str(r[c]).rjust(width[c]) if c in right else str(r[c]).ljust(width[c]) for c in cols).rstrip()

    header = {c: c for c in cols}
    return "\n".join([line(header), "  ".join("-" * width[c] for c in cols), *map(line, rows)])


def latency_plot(outcomes: list[Outcome], path: str) -> bool:
    """Median latency per measured variant (dot), with its p90 (whisker), one row each,
    grouped by phase, on a log axis; False when nothing was measured."""
    done = [o for o in outcomes if o.status == Status.OK and "latency_ms_median" in o.metrics]
    if not done:
        return False
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done.sort(key=lambda o: (o.axes.get("phase", ""), o.name))
    medians = [o.metrics["latency_ms_median"] for o in done]
    p90 = [o.metrics["latency_ms_p90"] - o.metrics["latency_ms_median"] for o in done]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(done) + 1.2))
    for i, o in enumerate(done):  # dots, not bars: a bar's length means nothing on a log axis
        ax.errorbar(
            medians[i], i, xerr=[[0], [p90[i]]], fmt="o", capsize=3, color="tab:red" if o.unstable else "tab:blue"
        )
    ax.set_yticks(range(len(done)), [o.name for o in done], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.set_xlabel("latency per call, ms (dot: median, whisker: p90; red: unstable)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
