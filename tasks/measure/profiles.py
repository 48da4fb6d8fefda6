"""Where a call's time goes, op by op: `bench.profile=true` profiles the phase's call after the
timed loop, in a profiled session of its own (ONNX Runtime, ExecuTorch) or under
torch.profiler (eager, compile), so no timed call ever runs with a profiler attached.

Each runtime that can names its profiler (`PROFILER`, a module attribute the config check
reads) and gives its session `profile(feeds, calls, folder) -> rows`; they all hand their
measurements to top_ops(), so every backend's table has the same columns:

  op            the runtime's own op name (ONNX op type, ExecuTorch kernel or XNNPACK
                operator, ATen op); "(other ops)" sums those past the first TOP,
                "(outside ops)" is the call's time no op accounts for (the runtime itself)
  per_call      executions per call
  us_per_call   exclusive (self) time per call, microseconds
  share         of the whole call's time (the rows sum to 1)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
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


# -- ONNX Runtime: its profiler's trace (Chrome trace format, microseconds) -----------------------
def onnxruntime_rows(trace: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The kernels of the runs after the first `warmup` ones (`model_run` spans)."""
    runs = sorted((e for e in trace if e.get("name") == "model_run"), key=lambda e: e["ts"])[warmup:]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in runs]
    per_op: dict[str, tuple[int, float]] = {}
    for e in trace:
        if e.get("cat") == "Node" and any(a <= e["ts"] <= b for a, b in spans):
            add(per_op, e["args"].get("op_name", e["name"]), float(e["dur"]))
    return top_ops(per_op, len(runs), float(sum(b - a for a, b in spans)))


# -- ExecuTorch: ETDump, read with its Inspector --------------------------------------------------
_WRAPPERS = {"Method::execute", "DELEGATE_CALL", "OPERATOR_CALL"}  # spans around other events
_INSTANCE = re.compile(r"\s#\d+$")  # XNNPACK numbers its operators: "Fully Connected (NC, F32) GEMM #2"


def executorch_op(name: str) -> str:
    """`native_call_expand_copy.out` -> `expand_copy (portable)`; XNNPACK's operators keep
    their name, without the instance number, marked `(xnnpack)`."""
    if name.startswith("native_call_"):
        return name.removeprefix("native_call_").removesuffix(".out").split(".")[0] + " (portable)"
    return _INSTANCE.sub("", name) + " (xnnpack)"


def executorch_rows(events: Iterable[tuple[str, list[float]]], warmup: int) -> list[dict[str, Any]]:
    """`events`: (name, one duration in us per execute call) of the ETDump's Execute block."""
    per_op: dict[str, tuple[int, float]] = {}
    call_us, calls = 0.0, 0
    for name, raw in events:
        timed = raw[warmup:]
        if name == "Method::execute":
            call_us, calls = call_us + sum(timed), calls + len(timed)
        elif name not in _WRAPPERS and timed:
            add(per_op, executorch_op(name), sum(timed), len(timed))
    return top_ops(per_op, calls, call_us)


# -- torch (eager, compile): torch.profiler ---------------------------------------------------------
def torch_rows(call: Callable[[], object], sync: Callable[[], None], cuda: bool, calls: int = CALLS):
    """The call under torch.profiler: each op's self time (CPU, and the device's on CUDA),
    the whole call's time from the host clock. Inside the session's timed_region."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARMUP):
        call()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        call_us = (time.perf_counter() - t0) * 1e6
    per_op: dict[str, tuple[int, float]] = {}
    for evt in prof.key_averages():
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        if us > 0 and not evt.key.startswith("ProfilerStep"):
            add(per_op, evt.key, float(us), int(evt.count))
    return top_ops(per_op, calls, call_us)
