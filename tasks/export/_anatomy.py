"""What is inside an exported artifact: its ops by type, the data-movement ops counted apart,
its constant (weight) bytes, and for ExecuTorch what each delegate partition took.

One dict per artifact, the same keys for every format, so two sweeps' artifacts can be set
side by side (orchestrator.read.compare shows what changed):

  ops            {op name: count} over the whole graph (ExecuTorch: inside delegates and out)
  outside_delegates {op name: count}  ExecuTorch: the ops left to portable kernels ({} for ONNX)
  partitions     [{"backend": ..., "ops": {op name: count}}]  ExecuTorch's delegate partitions
  nodes          how many ops (the sum of `ops`)
  transposes, copies, casts   data-movement ops, by the names in KINDS below
  constant_bytes weights and other constants stored with the graph
  artifact_bytes the file(s) on disk

Op names: ONNX's op type ("Transpose", "com.microsoft.RotaryEmbedding" for another domain);
ExecuTorch's edge op without its overload ("aten.permute_copy").
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

# the data-movement kinds counted apart, by op name: one table for every format
KINDS: dict[str, frozenset[str]] = {
    "transposes": frozenset({"Transpose", "aten.permute_copy", "aten.transpose_copy", "aten.t_copy"}),
    "copies": frozenset(
        {
            "Identity",
            "Expand",
            "Tile",
            "aten.clone",
            "aten.copy",
            "aten.expand_copy",
            "aten.alias_copy",
            "dim_order_ops._clone_dim_order",
        }
    ),
    "casts": frozenset({"Cast", "CastLike", "aten._to_copy", "dim_order_ops._to_dim_order_copy"}),
}
ARTIFACT = "anatomy.json"  # the whole record, on the variant's run
TABLE = "anatomy_ops.json"  # rows(): the op histogram as an MLflow table


def summary(ops: Counter, outside: Counter, partitions: list[dict], constant_bytes: int, artifact_bytes: int) -> dict:
    out: dict[str, Any] = {
        "ops": dict(sorted(ops.items())),
        "outside_delegates": dict(sorted(outside.items())),
        "partitions": partitions,
        "nodes": sum(ops.values()),
        "constant_bytes": int(constant_bytes),
        "artifact_bytes": int(artifact_bytes),
    }
    for kind, names in KINDS.items():
        out[kind] = sum(n for op, n in ops.items() if op in names)
    return out


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


# -- ONNX ---------------------------------------------------------------------------------
def _onnx_op(node: Any) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _onnx_graph_ops(graph: Any, ops: Counter) -> None:
    for node in graph.node:
        ops[_onnx_op(node)] += 1
        for attr in node.attribute:  # If / Loop / Scan bodies
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _onnx_graph_ops(sub, ops)


def _tensor_bytes(t: Any) -> int:
    import onnx

    for entry in t.external_data:
        if entry.key == "length":
            return int(entry.value)
    if t.raw_data:
        return len(t.raw_data)
    n = 1
    for d in t.dims:
        n *= d
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def onnx_anatomy(path: str | Path) -> dict:
    """The anatomy of an .onnx file (its external data is never read)."""
    import onnx

    path = Path(path)
    proto = onnx.load(str(path), load_external_data=False)
    ops: Counter = Counter()
    _onnx_graph_ops(proto.graph, ops)
    for fn in proto.functions:  # local functions the exporter kept: their bodies are ops too
        for node in fn.node:
            ops[_onnx_op(node)] += 1
    constants = sum(_tensor_bytes(t) for t in proto.graph.initializer)
    constants += sum(
        _tensor_bytes(a.t) for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")
    )
    files = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return summary(ops, Counter(), [], constants, files)


# -- ExecuTorch -----------------------------------------------------------------------------
def _edge_op(target: Any) -> str | None:
    """`aten.mul` for an edge or ATen op (`aten::mul.Tensor`: no overload); None for the
    plumbing between them (getitem, the delegate call)."""
    name = getattr(target, "_name", None)  # OpOverload / EdgeOpOverload: "aten::mul.Tensor"
    if not isinstance(name, str) or "::" not in name:
        return None
    namespace, op = name.split("::", 1)
    return f"{namespace}.{op.split('.')[0]}"


def _tensor_total(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


def executorch_anatomy(edge_program: Any) -> dict:
    """The anatomy of a lowered edge program, taken before to_executorch (which turns its ops
    into out-variants in place); the caller adds the .pte's artifact_bytes."""
    gm = edge_program.graph_module
    ops: Counter = Counter()
    outside: Counter = Counter()
    partitions = []
    constants = _tensor_total(edge_program.state_dict.values()) + _tensor_total(edge_program.constants.values())
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.name.startswith("lowered_module_"):
            lowered = getattr(gm, node.target)
            inner = lowered.original_module
            part: Counter = Counter(
                op for n in inner.graph.nodes if n.op == "call_function" and (op := _edge_op(n.target))
            )
            ops.update(part)
            constants += _tensor_total(inner.state_dict.values()) + _tensor_total(inner.constants.values())
            partitions.append({"backend": lowered.backend_id, "ops": dict(sorted(part.items()))})
        elif node.op == "call_function" and (op := _edge_op(node.target)):
            ops[op] += 1
            outside[op] += 1
    return summary(ops, outside, partitions, constants, 0)


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
