"""ONNX through torch.onnx.export(dynamo=True), with named inputs and outputs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from tasks.export.shapes import dynamic_shapes

# the ONNX weights go to an external file past this size (protobuf's 2 GiB limit)
EXTERNAL_DATA_BYTES = 1 << 30


def export(
    graph: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    options: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
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
            opset_version=options.get("opset"),
            external_data=weight_bytes > EXTERNAL_DATA_BYTES,
            optimize=options.get("optimize", True),
            verbose=False,
        )
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return path.name, {"onnx_nodes": len(proto.graph.node), "onnx_opset": proto.opset_import[0].version}
