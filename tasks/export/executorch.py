"""ExecuTorch (.pte): torch.export -> to_edge_transform_and_lower(XNNPACK) -> to_executorch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tasks.export.shapes import dynamic_shapes


def export(
    graph: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    options: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad():
        program = torch.export.export(
            graph, args, dynamic_shapes=dynamic_shapes(graph, args, input_names), strict=False
        )
        partitioners = [XnnpackPartitioner()] if options.get("delegate", "xnnpack") == "xnnpack" else []
        edge = to_edge_transform_and_lower(program, partitioner=partitioners)
        info = get_delegation_info(edge.exported_program().graph_module)
        et = edge.to_executorch()
    path = out_dir / "model.pte"
    path.write_bytes(et.buffer)
    total = info.num_delegated_nodes + info.num_non_delegated_nodes
    return path.name, {
        "delegate": options.get("delegate", "xnnpack"),
        "delegated_ops": info.num_delegated_nodes,
        "non_delegated_ops": info.num_non_delegated_nodes,
        "delegated_fraction": info.num_delegated_nodes / total if total else 0.0,
        "delegated_subgraphs": info.num_delegated_subgraphs,
    }
