"""ExecuTorch (.pte): torch.export -> to_edge_transform_and_lower(XNNPACK) -> to_executorch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.specs import choice

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "transformers", "executorch", "torchao")
# peak RSS 18.4 GB for the Llama-3.2-1B architecture in fp32 (4.9 GB of weights): 3.7x
MEMORY_FACTOR = 4.0
RESOURCES = {"num_cpus": 1}
DELEGATES = ("xnnpack", "none")


@dataclass(frozen=True)
class Options:
    delegate: str = "xnnpack"  # xnnpack | none (portable kernels only)

    def __post_init__(self) -> None:
        choice("backend.export_options.delegate", self.delegate, DELEGATES)


def export(
    graph: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    options: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    from tasks.export._shapes import dynamic_shapes

    opts = Options(**options)

    with torch.no_grad():
        program = torch.export.export(
            graph, args, dynamic_shapes=dynamic_shapes(graph, args, input_names), strict=False
        )
        partitioners = [XnnpackPartitioner()] if opts.delegate == "xnnpack" else []
        edge = to_edge_transform_and_lower(program, partitioner=partitioners)
        info = get_delegation_info(edge.exported_program().graph_module)
        et = edge.to_executorch()
    path = out_dir / "model.pte"
    path.write_bytes(et.buffer)
    total = info.num_delegated_nodes + info.num_non_delegated_nodes
    return path.name, {
        "delegate": opts.delegate,
        "delegated_ops": info.num_delegated_nodes,
        "non_delegated_ops": info.num_non_delegated_nodes,
        "delegated_fraction": info.num_delegated_nodes / total if total else 0.0,
        "delegated_subgraphs": info.num_delegated_subgraphs,
    }
