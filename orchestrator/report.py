"""What the sweep prints: the plan, progress lines, and the summary table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def say(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class Outcome:
    """Where one variant stands, and what the summary shows of it."""

    name: str
    status: str = "planned"  # planned | running | ok | failed | skipped
    run_id: str | None = None
    shapes: dict[str, list[int]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    stage: str | None = None
    error: str | None = None
    unstable: bool = False

    @property
    def ended(self) -> bool:
        return self.status in ("ok", "failed", "skipped")


def shapes_text(shapes: dict[str, list[int]]) -> str:
    """input_ids[1,128] | input_ids[1,1] pos[1] kv 4x[1,2,136,16]."""

    def dims(s: list[int]) -> str:
        return "[" + ",".join(map(str, s)) + "]"

    past = [s for n, s in shapes.items() if n.startswith("past_key_values.")]
    parts = [
        f"{'pos' if n == 'cache_position' else n}{dims(s)}" for n, s in shapes.items() if not n.startswith("past_")
    ]
    if past:
        parts.append(f"kv {len(past)}x{dims(past[0])}")
    return " ".join(parts)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def status_text(o: Outcome) -> str:
    if o.status == "ok":
        cv = o.metrics.get("latency_cv", 0.0)
        return f"ok, unstable (cv {cv:.0%})" if o.unstable else "ok"
    if o.status == "failed":
        return f"FAILED {o.stage}: {o.error}"
    if o.status == "skipped":
        return f"skipped: {o.error}"
    return o.status


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


def compare_rows(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Per variant in both sweeps: median B / median A, against the noise each reported.

    The noise band is the larger of the two runs' coefficients of variation: a variant is
    `within noise` when |ratio - 1| does not exceed it."""
    rows = []
    for name in sorted(set(a) & set(b)):
        ma, mb = a[name], b[name]
        if "latency_ms_median" not in ma or "latency_ms_median" not in mb:
            continue
        ratio = mb["latency_ms_median"] / ma["latency_ms_median"]
        noise = max(ma.get("latency_cv", 0.0), mb.get("latency_cv", 0.0))
        rows.append(
            {
                "variant": name,
                "median_ms_a": f"{ma['latency_ms_median']:.4f}",
                "median_ms_b": f"{mb['latency_ms_median']:.4f}",
                "ratio_b_a": f"{ratio:.3f}",
                "noise_cv": f"{noise:.1%}",
                "verdict": "within noise" if abs(ratio - 1) <= noise else "OUTSIDE noise",
            }
        )
    return rows


def sweep_metrics(client: Any, parent_run_id: str) -> dict[str, dict[str, float]]:
    """{variant name: metrics} of one sweep's child runs that ended ok."""
    parent = client.get_run(parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=10_000
    )
    return {r.info.run_name: r.data.metrics for r in runs if r.data.tags.get("status") == "ok"}


def latest_sweeps(client: Any, experiment: str, count: int = 2) -> list[str]:
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no MLflow experiment named {experiment!r}")
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string="tags.`phasesweep.role` = 'sweep'",
        order_by=["attributes.start_time DESC"],
        max_results=count,
    )
    return [r.info.run_id for r in reversed(runs)]


def latency_plot(outcomes: list[Outcome], path: str) -> bool:
    """Median latency per measured variant (dot), with its p90 (whisker), one row each,
    grouped by phase, on a log axis; False when nothing was measured."""
    done = [o for o in outcomes if o.status == "ok" and "latency_ms_median" in o.metrics]
    if not done:
        return False
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done.sort(key=lambda o: (o.name.split("_")[1], o.name))
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
