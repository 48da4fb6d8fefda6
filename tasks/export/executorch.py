"""ExecuTorch (.pte): torch.export -> to_edge_transform_and_lower(XNNPACK) -> to_executorch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.specs import choice

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "transformers", "executorch", "torchao")
PRELOAD = (
    "executorch.exir",
    "executorch.backends.xnnpack.partition.xnnpack_partitioner",
    "executorch.devtools.backend_debug",
    "tasks.export._xnnpack_patterns",  # XNNPACK's pattern graphs made once, before the fork (1.5-4 s of each export)
)
# peak RSS 18.4 GB for the Llama-3.2-1B architecture in fp32 (4.9 GB of weights): 3.7x
MEMORY_FACTOR = 4.0
RESOURCES = {"num_cpus": 1}
DELEGATES = ("xnnpack", "none")
# graph passes the export may run on the edge program before partitioning, in the order given
# (ExecuTorch's layout passes, executorch.backends.transforms): a sweep axis, e.g.
# backend.export_options.passes=[],[remove_permutes_around_elementwise]
PASSES = {
    "remove_permutes_around_elementwise": "remove_permutes_around_elementwise_ops:RemovePermutesAroundElementwiseOps",
    "fuse_cascaded_permutes": "fuse_cascaded_transpose_or_permute_ops:FuseCascadedTransposeOrPermuteOps",
    "fuse_permute_pairs": "fuse_transpose_or_permute_op_pairs_pass:FuseTransposeOrPermuteOpPairsPass",
    "postpone_permutes": "postpone_permute_below_squeeze_view:PostponePermuteOpBelowSqueezeOrUnsqueezeLikeView",
}


@dataclass(frozen=True)
class Options:
    delegate: str = "xnnpack"  # xnnpack | none (portable kernels only)
    passes: list[str] = field(default_factory=list)  # names of PASSES, run in this order; [] runs none

    def __post_init__(self) -> None:
        choice("backend.export_options.delegate", self.delegate, DELEGATES)
        for name in self.passes:
            choice("backend.export_options.passes[]", name, tuple(PASSES))


def _pass(name: str):
    import importlib

    module, cls = PASSES[name].split(":")
    return getattr(importlib.import_module(f"executorch.backends.transforms.{module}"), cls)()


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
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    from tasks.export._anatomy import executorch_anatomy
    from tasks.export._description import executorch_methods
    from tasks.export._shapes import dynamic_shapes

    opts = Options(**options)

    with torch.no_grad():
        program = torch.export.export(
            graph, args, dynamic_shapes=dynamic_shapes(graph, args, input_names), strict=False
        )
        partitioners = [XnnpackPartitioner()] if opts.delegate == "xnnpack" else []
        edge = to_edge_transform_and_lower(
            program,
            transform_passes=[_pass(name) for name in opts.passes],
            partitioner=partitioners,
            constant_methods=executorch_methods(description),
        )
        info = get_delegation_info(edge.exported_program().graph_module)
        anatomy = executorch_anatomy(edge.exported_program())
        et = edge.to_executorch()
    path = out_dir / "model.pte"
    path.write_bytes(et.buffer)
    anatomy["artifact_bytes"] = path.stat().st_size
    total = info.num_delegated_nodes + info.num_non_delegated_nodes
    return path.name, {
        "delegate": opts.delegate,
        "passes": ",".join(opts.passes) or "none",
        "delegated_ops": info.num_delegated_nodes,
        "non_delegated_ops": info.num_non_delegated_nodes,
        "delegated_fraction": info.num_delegated_nodes / total if total else 0.0,
        "delegated_subgraphs": info.num_delegated_subgraphs,
    }, anatomy
