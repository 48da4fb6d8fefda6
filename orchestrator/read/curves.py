"""The sweep's curves in its summary: decode latency along phase.depths (one variant's series,
MLflow step metrics depth_*) and throughput along a swept phase.batch (one variant per batch),
with the batch at which aggregate throughput stops growing (the knee, KNEE_RULE)."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from orchestrator.common.console import table
from orchestrator.common.outcome import Outcome, Status

DEPTH_MEDIAN = "depth_latency_ms_median"  # tasks/depth_series.py: PREFIX + the headline's name
DEPTH_SHARE = "depth_bandwidth_share"
BATCH = "phase.batch"
KNEE_GAIN = 0.10
KNEE_RULE = f"knee: the last batch before the first one adding under {KNEE_GAIN:.0%} aggregate tokens/s over its predecessor"


def depth_rows(outcomes: list[Outcome]) -> list[dict[str, str]]:
    """One row per variant with a depth series: its median latency (and bandwidth share) at each depth."""
    rows = []
    for o in outcomes:
        points = dict(o.series.get(DEPTH_MEDIAN, ()))
        if o.status != Status.OK or len(points) < 2:
            continue
        share = dict(o.series.get(DEPTH_SHARE, ()))
        row = {"variant": o.name}
        for depth, ms in sorted(points.items()):
            row[f"depth {depth}"] = f"{ms:.3f} ms" + (f" ({share[depth]:.0%} bw)" if depth in share else "")
        rows.append(row)
    return rows


def batch_of(params: dict[str, Any]) -> int | None:
    try:
        return int(float(params.get(BATCH)))
    except (TypeError, ValueError):
        return None


def batch_groups(outcomes: list[Outcome], params: dict[str, dict[str, Any]]) -> dict[str, list[tuple[int, Outcome]]]:
    """Variants that differ by phase.batch alone (their names without `_b<N>`), measured at two batches or more."""
    groups: dict[str, list[tuple[int, Outcome]]] = defaultdict(list)
    for o in outcomes:
        batch = batch_of(params.get(o.name, {}))
        if batch is not None:
            groups[re.sub(r"_b\d+(?=_|$)", "", o.name)].append((batch, o))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in sorted(groups.items()) if len({b for b, _ in v}) >= 2}


def knee(points: list[tuple[int, float]]) -> tuple[int, bool]:
    """(the knee's batch, whether throughput stopped growing within the sweep) of (batch, aggregate
    tokens/s) points in batch order: the batch before the first step that adds under KNEE_GAIN."""
    for (b0, t0), (_, t1) in zip(points, points[1:], strict=False):
        if t1 < t0 * (1 + KNEE_GAIN):
            return b0, True
    return points[-1][0], False


def batch_rows(outcomes: list[Outcome], params: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per batch sweep: aggregate and per-sequence tokens/s at each batch (or why none), and its knee."""
    rows = []
    for group, members in batch_groups(outcomes, params).items():
        row = {"variants": group}
        measured = []
        for batch, o in members:
            tps = o.metrics.get("tokens_per_s")
            if o.status == Status.OK and tps is not None:
                row[f"b{batch}"] = f"{tps:,.0f} ({tps / batch:,.0f}/seq)"
                measured.append((batch, tps))
            else:
                row[f"b{batch}"] = str(o.status)
        if len(measured) >= 2:
            b, stopped = knee(measured)
            row["knee"] = f"b{b}" if stopped else f"none (still growing at b{b})"
        else:
            row["knee"] = "-"
        rows.append(row)
    return rows


def curves_text(outcomes: list[Outcome], params: dict[str, dict[str, Any]]) -> str:
    """The depth and batch tables the summary prints after its own, or ''."""
    parts = []
    if depth := depth_rows(outcomes):
        parts.append("Decode by cache depth (median latency; bw: achieved bandwidth share; step metrics depth_*)\n" + _table(depth))
    if batch := batch_rows(outcomes, params):
        parts.append(f"Throughput by batch (aggregate tokens/s, per sequence; {KNEE_RULE})\n" + _table(batch))
    return "\n\n".join(parts)


def _table(rows: list[dict[str, str]]) -> str:
    """Rows with differing columns as one table (a missing cell: '-')."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return table([{c: r.get(c, "-") for c in cols} for r in rows])
