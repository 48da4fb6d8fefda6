"""The sweep's plots, drawn alike from a sweep's outcomes and from MLflow runs (the report).

A row is a plain dict per variant: name, model, phase, backend, device, status, unstable,
params (those in PLOT_PARAMS, as text) and metrics; only rows that ended ok with a median are drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.common.outcome import Outcome
from orchestrator.read.curve_plots import batch_plot, depth_plot
from orchestrator.read.curves import BATCH
from orchestrator.read.draw import (
    CI_HIGH,
    CI_LOW,
    MEDIAN,
    P90,
    by_panel,
    join_label,
    log_axis,
    panel_grid,
    pyplot,
    save,
    suffix,
)
from orchestrator.read.generation import PROMPT_LEN
from orchestrator.read.generation_plot import generation_plot
from orchestrator.read.quality_plot import quality_plot
from orchestrator.read.trend_plots import CONTEXT_LEN, context_plot, memory_plot, speedup_plot

LATENCY = "latency.png"  # at the root of the sweep's run
CONTEXT = "plots/context_length.png"
SPEEDUP = "plots/speedup_vs_eager.png"
MEMORY = "plots/latency_vs_memory.png"
QUALITY = "plots/speed_vs_quality.png"
DEPTH = "plots/latency_vs_depth.png"
BATCH_PLOT = "plots/throughput_vs_batch.png"
GENERATION = "plots/generation_ttft_tpot.png"
PLOT_PARAMS = (CONTEXT_LEN, BATCH, PROMPT_LEN)


def plot_rows(outcomes: list[Outcome], params: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each outcome as a row; `params`: variant name -> its flattened config (Variant.params or an MLflow run's)."""
    params = params or {}
    return [
        {
            "name": o.name,
            **{k: o.axes.get(k, "") for k in ("model", "phase", "backend", "device")},
            "status": str(o.status),
            "unstable": o.unstable,
            "params": {k: str(v) for k, v in params.get(o.name, {}).items() if k in PLOT_PARAMS},
            "metrics": dict(o.metrics),
            "series": dict(o.series),
        }
        for o in outcomes
    ]


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok" and r.get("metrics", {}).get(MEDIAN) is not None]


def make_plots(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Every plot the rows have the axes for, written under out_dir; the files written,
    latency.png first (none when nothing was measured)."""
    ok = measured(rows)
    if not ok:
        return []
    out_dir = Path(out_dir)
    written = []
    drawn = ((LATENCY, latency_plot), (CONTEXT, context_plot), (SPEEDUP, speedup_plot), (MEMORY, memory_plot))
    curves = ((DEPTH, depth_plot), (BATCH_PLOT, batch_plot), (GENERATION, generation_plot))
    for rel, draw in (*drawn, (QUALITY, quality_plot), *curves):
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if draw(ok, path):
            written.append(path)
    return written


def latency_plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """One panel per model x phase, one line per variant (backend, device and what else its
    name says), median latency as a dot, its 95% CI as a thick bar, p90 as a thin whisker, on
    a log axis; unstable variants in red."""
    ordered = sorted(rows, key=lambda r: (r["model"], r["phase"], r["metrics"][MEDIAN]))
    fig, panels = panel_grid(pyplot(), by_panel(ordered), 7.5, lambda n: 0.42 * n + 1.4)
    for ax, _, group in panels:
        values = [v for i, r in enumerate(group) for v in _latency_line(ax, i, r)]
        ax.set_yticks(range(len(group)), [join_label(r["backend"], r["device"], suffix(r)) for r in group], fontsize=9)
        ax.set_ylim(len(group) - 0.5, -0.5)
        log_axis(ax.xaxis, values)
        ax.set_xlim(min(values) / 1.6, max(values) * 2.2)  # room for the value labels
        ax.grid(axis="x", which="major", alpha=0.3)
        ax.set_xlabel("latency per call, ms (log)", fontsize=9)
    fig.suptitle(
        "Latency per backend — dot: median, thick bar: 95% CI of the median, whisker: p90; red: unstable",
        fontsize=10,
    )
    fig.tight_layout()
    return save(fig, path)


def _latency_line(ax: Any, i: int, r: dict[str, Any]) -> list[float]:
    """Row i of a latency panel: median dot, CI bar, p90 whisker and the median's value; the
    values drawn."""
    m = r["metrics"]
    color = "tab:red" if r.get("unstable") else "tab:blue"
    med = m[MEDIAN]
    values = [med]
    if m.get(P90) is not None:
        ax.plot([med, m[P90]], [i, i], color=color, lw=1, alpha=0.8)
        ax.plot([m[P90]], [i], marker="|", color=color, ms=9)
        values.append(m[P90])
    if m.get(CI_LOW) is not None and m.get(CI_HIGH) is not None:
        ax.plot([m[CI_LOW], m[CI_HIGH]], [i, i], color=color, lw=5, alpha=0.35, solid_capstyle="butt")
        values += [m[CI_LOW], m[CI_HIGH]]
    ax.plot([med], [i], "o", color=color, ms=6, zorder=3)
    note = f"{med:.3g} ms" + ("  unstable" if r.get("unstable") else "")
    ax.annotate(note, (max(med, m.get(P90) or med), i), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8, color=color)
    return values


def profile_plot(rows: list[dict[str, Any]], name: str, path: Path) -> bool:
    """The top ops of one variant's call as horizontal bars of time per call, largest on top,
    each labelled with its share of the call and executions per call; the rest and the time
    outside ops in grey."""
    if not rows:
        return False
    plt = pyplot()
    ordered = list(reversed(rows))  # barh draws bottom-up
    fig, ax = plt.subplots(figsize=(8.5, 0.32 * len(rows) + 1.4))
    colors = ["0.7" if r["op"].startswith("(") else "C0" for r in ordered]
    ax.barh(range(len(ordered)), [r["us_per_call"] for r in ordered], color=colors)
    ax.set_yticks(range(len(ordered)), [r["op"] for r in ordered], fontsize=8)
    for i, r in enumerate(ordered):
        note = f" {r['share']:.1%}" + (f"  x{r['per_call']:g}" if r["per_call"] else "")
        ax.annotate(note, (r["us_per_call"], i), va="center", fontsize=7, xytext=(2, 0), textcoords="offset points")
    ax.set_xlim(0, max(r["us_per_call"] for r in rows) * 1.25)
    ax.set_xlabel("exclusive time per call, us  (label: share of the call, executions per call)")
    ax.set_title(f"Where the call's time goes: {name}", fontsize=10, loc="left")
    ax.grid(alpha=0.3, axis="x")
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, path)

