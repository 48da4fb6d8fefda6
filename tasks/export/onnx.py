"""ONNX through torch.onnx.export(dynamo=True), with named inputs and outputs."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.export._anatomy import summary
from tasks.specs import at_least

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "transformers", "onnx", "onnxscript")
# the exporter's modules and those it imports on its first call, imported once by the fork server
PRELOAD = (
    "onnx",
    "onnxscript",
    "torch.onnx",
    "torch.export",
    "networkx",
    "onnxscript.function_libs.torch_lib.ops",
    "onnxscript.optimizer",
    "onnxscript.rewriter",
)
MEMORY_FACTOR = 1.5  # an export's peak memory, as a multiple of the weights
RESOURCES = {"num_cpus": 1}
EXTERNAL_DATA_BYTES = 1 << 30  # weights past this go to an external file (protobuf's 2 GiB limit)
# model choices this format cannot express: planned as skipped with the reason (orchestrator/plan/planner.py)
REFUSES = {
    "model.kv_cache": {"update_cache": "ONNX has no llama::update_cache / custom_sdpa (ExecuTorch's LLM custom ops)"},
    "model.attention": {"custom_sdpa": "ONNX has no llama::update_cache / custom_sdpa (ExecuTorch's LLM custom ops)"},
}
# data-movement ops by ONNX op type (tasks/export/_anatomy.py)
MOVEMENT = {
    "transposes": frozenset({"Transpose"}),
    "copies": frozenset({"Identity", "Expand", "Tile"}),
    "casts": frozenset({"Cast", "CastLike"}),
}


@dataclass(frozen=True)
class Options:
    opset: int | None = None  # None: the exporter's default opset
    optimize: bool = True  # onnxscript graph optimizations after export

    def __post_init__(self) -> None:
        at_least("backend.export_options.opset", self.opset, 18, optional=True)


def export(
    graph: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    options: dict[str, Any],
    description: dict[str, Any],
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    import onnx
    import torch

    from tasks.export._shapes import dynamic_shapes

    opts = Options(**options)
    path = out_dir / "model.onnx"
    weight_bytes = sum(p.numel() * p.element_size() for p in graph.parameters())
    logging.getLogger("torch.onnx").setLevel(logging.WARNING)
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            graph,
            args,
            str(path),
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes(graph, args, input_names),
            opset_version=opts.opset,
            external_data=weight_bytes > EXTERNAL_DATA_BYTES,
            optimize=opts.optimize,
            verbose=False,
        )
    proto = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    onnx.helper.set_model_props(proto, metadata(description))
    onnx.save(proto, str(path))
    details = {"onnx_nodes": len(proto.graph.node), "onnx_opset": proto.opset_import[0].version}
    return path.name, details, anatomy(path)


# -- the description, as metadata_props (ONNX Runtime: get_modelmeta().custom_metadata_map) ------
def metadata(description: dict[str, Any]) -> dict[str, str]:
    """`phasesweep.<field>`: strings as they are, everything else as JSON."""
    return {f"phasesweep.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in description.items()}


def read_metadata(props: dict[str, str]) -> dict[str, Any]:
    """The description back from an ONNX file's metadata map."""
    return {
        key.removeprefix("phasesweep."): json.loads(value) if value.startswith("{") else value
        for key, value in props.items()
        if key.startswith("phasesweep.")
    }


# -- the anatomy: op types ("Transpose", "com.microsoft.RotaryEmbedding" for another domain) -----
def _op(node: Any) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _graph_ops(graph: Any, ops: Counter) -> None:
    for node in graph.node:
        ops[_op(node)] += 1
        for attr in node.attribute:  # If / Loop / Scan bodies
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _graph_ops(sub, ops)


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


def anatomy(path: str | Path) -> dict:
    """The anatomy of an .onnx file (its external data is never read)."""
    import onnx

    path = Path(path)
    proto = onnx.load(str(path), load_external_data=False)
    ops: Counter = Counter()
    _graph_ops(proto.graph, ops)
    for fn in proto.functions:  # local functions the exporter kept
        for node in fn.node:
            ops[_op(node)] += 1
    constants = sum(_tensor_bytes(t) for t in proto.graph.initializer)
    constants += sum(
        _tensor_bytes(a.t) for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")
    )
    files = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return summary(ops, Counter(), [], constants, files, MOVEMENT)
