"""An artifact's anatomy record built from the counts its format's walk found (tasks/export/<format>.py
`anatomy`); the record's keys, and reading it, are tasks/measure/anatomy.py's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tasks.export import format_module
from tasks.measure.anatomy import KINDS
from tasks.registry import available


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
    tables = [format_module(name).MOVEMENT for name in available("tasks.export")]
    return {kind: frozenset().union(*(t.get(kind, ()) for t in tables)) for kind in KINDS}
