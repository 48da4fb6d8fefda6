"""Where a call's time goes, op by op (bench.profile=true): after the timed loop, never during
it. A runtime that can profile names its profiler (PROFILER) and gives its session
`profile(feeds, calls, folder) -> rows`, its own measurements handed to top_ops(), so every
backend's table has the same columns:

  op            the runtime's own op name; "(other ops)" sums those past the first TOP,
                "(outside ops)" is the call's time no op accounts for
  per_call      executions per call
  us_per_call   exclusive (self) time per call, microseconds
  share         of the whole call's time (the rows sum to 1)
"""

from __future__ import annotations

from typing import Any

WARMUP = 3  # calls before the profiled ones (allocations, lazy initialisation)
CALLS = 20  # profiled calls
TOP = 15  # rows before "(other ops)"
TABLE = "profile_ops.json"  # the table on the variant's run
CHART = "profile_ops.png"


def top_ops(per_op: dict[str, tuple[int, float]], calls: int, call_us: float, top: int = TOP) -> list[dict[str, Any]]:
    """`per_op`: {op: (executions, total exclusive us)} over `calls` calls that took `call_us`
    in all. The most expensive `top` ops, then the rest summed, then the time outside ops."""
    ranked = sorted(per_op.items(), key=lambda kv: (-kv[1][1], kv[0]))
    rows = [_row(op, n, us, calls, call_us) for op, (n, us) in ranked[:top]]
    rest = ranked[top:]
    if rest:
        rows.append(_row("(other ops)", sum(n for _, (n, _) in rest), sum(us for _, (_, us) in rest), calls, call_us))
    outside = call_us - sum(us for _, (_, us) in ranked)
    if outside > 0:
        rows.append(_row("(outside ops)", 0, outside, calls, call_us))
    return rows


def _row(op: str, n: int, us: float, calls: int, call_us: float) -> dict[str, Any]:
    return {
        "op": op,
        "per_call": round(n / calls, 3),
        "us_per_call": round(us / calls, 3),
        "share": round(us / call_us, 4) if call_us > 0 else 0.0,
    }


def add(per_op: dict[str, tuple[int, float]], op: str, us: float, executions: int = 1) -> None:
    n, total = per_op.get(op, (0, 0.0))
    per_op[op] = (n + executions, total + us)
