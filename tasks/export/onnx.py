"""ONNX through torch.onnx.export(dynamo=True), with named inputs and outputs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.specs import at_least

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "transformers", "onnx", "onnxscript")
# what a fork server imports for its children (tasks/worker/forks.py): the exporter's own modules
# and those it imports on its first call (torch.export's tracer, AOT autograd and its
# partitioner's networkx, torchlib's ops, the onnxscript optimiser): 0.5 s of each export
PRELOAD = (
    "onnx",
    "onnxscript",
    "torch.onnx",
    "torch.onnx._internal.exporter._core",
    "torch.export",
    "torch._export.serde.serialize",
    "torch._functorch.aot_autograd",
    "torch._functorch.partitioners",
    "torch._inductor.decomposition",
    "networkx",
    "onnxscript.function_libs.torch_lib.ops",
    "onnxscript.optimizer",
    "onnxscript.rewriter",
    "tasks.export._onnx_registry",  # torchlib's op table built once, before the fork (0.4 s of each export)
)
# peak RSS of an export as a multiple of the weights: 6.2 GB for the Llama-3.2-1B
# architecture in fp32 (4.9 GB of weights), 1.3x, rounded up
MEMORY_FACTOR = 1.5
RESOURCES = {"num_cpus": 1}
# the ONNX weights go to an external file past this size (protobuf's 2 GiB limit)
EXTERNAL_DATA_BYTES = 1 << 30


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
    import onnx

    from tasks.export._anatomy import onnx_anatomy
    from tasks.export._description import onnx_metadata

    proto = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    onnx.helper.set_model_props(proto, onnx_metadata(description))
    onnx.save(proto, str(path))
    details = {"onnx_nodes": len(proto.graph.node), "onnx_opset": proto.opset_import[0].version}
    return path.name, details, onnx_anatomy(path)
