"""What is inside an exported artifact, one dict per artifact with the same keys for every
format, so two sweeps' artifacts compare (orchestrator.read.compare). Each format walks its
own artifact (tasks/export/<format>.py `anatomy`) and hands the counts to summary():

  ops            {op name: count} over the whole graph (ExecuTorch: inside delegates and out)
  outside_delegates {op name: count}  ops left to portable kernels ({} without delegates)
  partitions     [{"backend": ..., "ops": {op name: count}}]  delegate partitions
  nodes          how many ops (the sum of `ops`)
  transposes, copies, casts   data-movement ops, by the format's own op names
  constant_bytes weights and other constants as the artifact stores them (packed int4, its
                 scales and zero points count as their stored bytes)
  lookup_tables  [{"bytes": ..., "rows": ...}]  the constants only read by row (an embedding
                 table): a decode step reads its batch's rows of each, not the table
  artifact_bytes the file(s) on disk

Torch-free: the driver logs and compares anatomies.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

KINDS = ("transposes", "copies", "casts")  # the data-movement kinds counted apart
ARTIFACT = "anatomy.json"  # the whole record, on the variant's run
TABLE = "anatomy_ops.json"  # rows(): the op histogram as an MLflow table


def summary(
    ops: Counter,
    outside: Counter,
    partitions: list[dict],
    constant_bytes: int,
    artifact_bytes: int,
    movement: dict[str, frozenset[str]] | None = None,
    lookups: list[dict[str, int]] | None = None,
) -> dict:
    """`movement`: the format's op names of each of KINDS (its MOVEMENT); None: every
    format's of this package (their op names do not collide). `lookups`: the
    lookup_tables."""
    movement = movement if movement is not None else _every_format_movement()
    out: dict[str, Any] = {
        "ops": dict(sorted(ops.items())),
        "outside_delegates": dict(sorted(outside.items())),
        "partitions": partitions,
        "nodes": sum(ops.values()),
        "constant_bytes": int(constant_bytes),
        "artifact_bytes": int(artifact_bytes),
        "lookup_tables": [{"bytes": int(t["bytes"]), "rows": int(t["rows"])} for t in lookups or ()],
    }
    for kind in KINDS:
        out[kind] = sum(n for op, n in ops.items() if op in movement.get(kind, ()))
    return out


def _every_format_movement() -> dict[str, frozenset[str]]:
    from tasks.export import format_module
    from tasks.registry import available

    tables = [format_module(name).MOVEMENT for name in available("tasks.export")]
    return {kind: frozenset().union(*(t.get(kind, ()) for t in tables)) for kind in KINDS}


def bytes_read_per_step(anatomy: dict, rows: int) -> int:
    """The stored constant bytes one call reads when it looks up `rows` rows of each lookup
    table: every other constant whole (a decode step's weights, as stored: quantised or not)."""
    tables = anatomy.get("lookup_tables", [])
    whole = anatomy["constant_bytes"] - sum(t["bytes"] for t in tables)
    return whole + sum(min(rows, t["rows"]) * t["bytes"] // t["rows"] for t in tables if t["rows"])


def headline(anatomy: dict) -> dict[str, float]:
    """The counts logged as metrics: anatomy_nodes, anatomy_transposes, ..."""
    values = {k: anatomy[k] for k in ("nodes", *KINDS, "constant_bytes")}
    values["partitions"] = len(anatomy["partitions"])
    values["ops_outside_delegates"] = sum(anatomy["outside_delegates"].values())
    return {f"anatomy_{k}": float(v) for k, v in values.items()}


def rows(anatomy: dict) -> list[dict[str, Any]]:
    """The op histogram as a table, most frequent first; for ExecuTorch also how many of
    each ran in a delegate and how many on portable kernels."""
    outside = anatomy.get("outside_delegates", {})
    split = bool(outside or anatomy.get("partitions"))
    out = []
    for op, n in sorted(anatomy["ops"].items(), key=lambda kv: (-kv[1], kv[0])):
        row: dict[str, Any] = {"op": op, "count": n}
        if split:
            row.update(delegated=n - outside.get(op, 0), portable=outside.get(op, 0))
        out.append(row)
    return out


def _delegated(anatomy: dict) -> dict[str, int]:
    outside = anatomy.get("outside_delegates", {})
    return {op: n - outside.get(op, 0) for op, n in anatomy["ops"].items()}


def changes(before: dict, after: dict, most: int = 6) -> list[str]:
    """What changed inside an artifact between two exports, in words: "+24 transposes",
    "aten.scaled_dot_product_attention no longer delegated", "new op Softmax (x2)"."""
    out = []
    for kind, word in (("nodes", "ops"), ("transposes", "transposes"), ("copies", "copies"), ("casts", "casts")):
        if d := after[kind] - before[kind]:
            out.append(f"{d:+d} {word}")
    if d := len(after.get("partitions", [])) - len(before.get("partitions", [])):
        out.append(f"{d:+d} delegate partitions")
    if before["constant_bytes"] != after["constant_bytes"]:
        out.append(f"constants {before['constant_bytes']:,} -> {after['constant_bytes']:,} bytes")
    was, now = _delegated(before), _delegated(after)
    for op in sorted(set(was) & set(now)):
        if was[op] and not now[op]:
            out.append(f"{op} no longer delegated")
        elif now[op] and not was[op]:
            out.append(f"{op} now delegated")
    ops_before, ops_after = before["ops"], after["ops"]
    moved = [
        (op, ops_after.get(op, 0) - ops_before.get(op, 0))
        for op in sorted(set(ops_before) | set(ops_after))
        if ops_after.get(op, 0) != ops_before.get(op, 0)
    ]
    for op, d in sorted(moved, key=lambda m: (-abs(m[1]), m[0]))[:most]:
        if op not in ops_before:
            out.append(f"new op {op} (x{d})")
        elif op not in ops_after:
            out.append(f"no {op} any more (was x{-d})")
        else:
            out.append(f"{op} {d:+d}")
    return out
