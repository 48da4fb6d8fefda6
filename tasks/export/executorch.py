"""ExecuTorch (.pte): torch.export -> to_edge_transform_and_lower(XNNPACK) -> to_executorch.

A graph holding its KV cache (model.kv_cache=update_cache) keeps ExecuTorch's llama custom
ops (update_cache, custom_sdpa) as they are, outside the delegate, and its caches as mutable
buffers in the program, as ExecuTorch's own LLM export does: inputs are the caller's, and
memory is planned for the largest token count the graph's bounds allow."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.contract import ExportFormat, Point
from tasks.export._anatomy import summary
from tasks.export._gelu_tanh import write_out_tanh_gelu
from tasks.export._pte_bytes import lookup_tables, segment_bytes
from tasks.model import quant as quantising  # quantising.quantize looked up when called: a test may stand in for it
from tasks.specs import IN_GRAPH_KV_CACHES, choice

if TYPE_CHECKING:
    import torch

# xnnpack: every op XNNPACK takes; xnnpack_linear: its linear layers only, the rest on portable
# kernels in the calling thread (export_llama -X's XnnpackDynamicallyQuantizedPartitioner)
DELEGATES = ("xnnpack", "xnnpack_linear", "none")
# graph passes run on the edge program before partitioning, in the order given
# (executorch.backends.transforms), e.g. backend.export_options.passes=[remove_permutes_around_elementwise]
PASSES = {
    "remove_permutes_around_elementwise": "remove_permutes_around_elementwise_ops:RemovePermutesAroundElementwiseOps",
    "fuse_cascaded_permutes": "fuse_cascaded_transpose_or_permute_ops:FuseCascadedTransposeOrPermuteOps",
    "fuse_permute_pairs": "fuse_transpose_or_permute_op_pairs_pass:FuseTransposeOrPermuteOpPairsPass",
    "postpone_permutes": "postpone_permute_below_squeeze_view:PostponePermuteOpBelowSqueezeOrUnsqueezeLikeView",
}
# data-movement ops by edge op name, without overload (tasks/export/_anatomy.py)
MOVEMENT = {
    "transposes": frozenset({"aten.permute_copy", "aten.transpose_copy", "aten.t_copy"}),
    "copies": frozenset(
        {"aten.clone", "aten.copy", "aten.expand_copy", "aten.alias_copy", "dim_order_ops._clone_dim_order"}
    ),
    "casts": frozenset({"aten._to_copy", "dim_order_ops._to_dim_order_copy"}),
}
METHOD = "phasesweep_description"  # the .pte's constant method holding the description as JSON


@dataclass(frozen=True)
class Options:
    delegate: str = "xnnpack"  # one of DELEGATES; none: portable kernels only
    passes: list[str] = field(default_factory=list)  # names of PASSES, run in this order

    def __post_init__(self) -> None:
        choice("backend.export_options.delegate", self.delegate, DELEGATES)
        for name in self.passes:
            choice("backend.export_options.passes[]", name, tuple(PASSES))


class ExecutorchFormat(ExportFormat):
    """Everything ExecuTorch cannot make or run is decided here (its runtime runs what the .pte holds)."""

    LIBRARIES = ("torch", "transformers", "executorch", "torchao")
    REQUIRES = ("executorch",)
    PRELOAD = (
        "executorch.exir",
        "executorch.backends.xnnpack.partition.xnnpack_partitioner",
        "executorch.devtools.backend_debug",
        "tasks.export._xnnpack_patterns",  # XNNPACK's pattern graphs, made once before the fork
    )
    MEMORY_FACTOR = 4.0  # an export's peak memory, as a multiple of the weights
    MOVEMENT = MOVEMENT
    Options = Options
    QUANTS = {"cpu": ("none", "8da4w")}
    QUANT_NOTE = (
        "the installed ExecuTorch's XNNPACK delegate lowers only dynamically quantised linears (8da4w); a weight-only "
        "int8/int4 linear is delegated as a float linear over its raw integer weights (wrong logits, full-size .pte)"
    )

    def limits(self, point: Point) -> str | None:
        """A quantised model needs the XNNPACK delegate (the portable kernels have no torchao quantised
        ops) and float32 or float16 (a bfloat16 8da4w .pte fails to load its method in executorch 1.5.1)."""
        quant = point.model.quant
        if quant == "none":
            return None
        if point.export_options.get("delegate", "xnnpack") == "none":
            return f"model.quant={quant} needs backend.export_options.delegate=xnnpack or xnnpack_linear (no portable torchao kernels)"
        if point.model.dtype == "bfloat16":
            return f"model.quant={quant} with model.dtype=bfloat16: the .pte's method fails to load in this ExecuTorch"
        return None

    def export(self, graph, args, input_names, output_names, out_dir, options, description):
        return export(graph, args, input_names, output_names, out_dir, options, description)


def partitioners(delegate: str, quant: str) -> list[Any]:
    """XNNPACK's partitioners: for a quantised model, the dynamically quantised linears first, then
    everything else, as ExecuTorch's export_llama (`-qmode 8da4w -X`)."""
    # lazy: executorch, only in a job's process
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )

    if delegate == "xnnpack_linear":  # export_llama -X: only the linear layers
        return [XnnpackDynamicallyQuantizedPartitioner()]
    if delegate != "xnnpack":
        return []
    if quant == "none":
        return [XnnpackPartitioner()]
    return [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()]


def _pass(name: str):
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
    # lazy: torch, only in a job's process
    import torch

    opts = Options(**options)
    model = description["model"]
    quantized = quantising.quantize(graph, model["quant"], model["quant_group"])  # after the float reference was made
    in_graph = getattr(graph, "kv_cache", None) in IN_GRAPH_KV_CACHES
    with torch.no_grad():
        edge = _lower(graph, args, input_names, opts, description)
        inside = anatomy(edge.exported_program())  # before to_executorch turns its ops into out-variants
        details = _delegation(edge, inside, opts)
        et = edge.to_executorch(_memory_planning() if in_graph else None)
    path = out_dir / "model.pte"
    path.write_bytes(et.buffer)
    inside["artifact_bytes"] = path.stat().st_size
    inside["constant_bytes"] = segment_bytes(path) or inside["constant_bytes"]  # as the file stores them
    return path.name, {**details, **quantized}, inside


def _lower(graph: Any, args: tuple, input_names: list[str], opts: Options, description: dict[str, Any]) -> Any:
    """torch.export of the graph, lowered to the edge dialect with the chosen passes and partitioners."""
    # lazy: torch, only in a job's process
    import torch

    # lazy: executorch, only in a job's process
    from executorch.exir import to_edge_transform_and_lower

    # lazy: it imports torch or its kin, which this module's importers (the driver) must not
    from tasks.export._shapes import dynamic_shapes, example_args

    args = example_args(graph, args)
    program = torch.export.export(graph, args, dynamic_shapes=dynamic_shapes(graph, args, input_names), strict=False)
    if opts.delegate == "xnnpack":  # XNNPACK would run a tanh GELU as an exact one
        program = write_out_tanh_gelu(program)
    return to_edge_transform_and_lower(
        program,
        transform_passes=[_pass(name) for name in opts.passes],
        partitioner=partitioners(opts.delegate, description["model"]["quant"]),
        constant_methods=constant_methods(description),
    )


def _memory_planning() -> Any:
    """An in-graph cache's config: inputs owned by the caller; memory planned for the upper bound
    of S, not the example's."""
    # lazy: executorch, only in a job's process
    from executorch.exir import ExecutorchBackendConfig

    # lazy: executorch, only in a job's process
    from executorch.exir.passes import MemoryPlanningPass

    # lazy: executorch, only in a job's process
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
    )


def _delegation(edge: Any, inside: dict[str, Any], opts: Options) -> dict[str, Any]:
    """What the delegate took, what it left to custom kernels, and the options that chose it."""
    # lazy: executorch, only in a job's process
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge.exported_program().graph_module)
    total = info.num_delegated_nodes + info.num_non_delegated_nodes
    custom = {op: n for op, n in inside["outside_delegates"].items() if op.split(".")[0] not in CORE_NAMESPACES}
    return {
        "custom_ops": ", ".join(f"{op} x{n}" for op, n in custom.items()) or "none",  # kernels outside XNNPACK
        "mutable_buffers": _mutated_buffers(edge),
        "delegate": opts.delegate,
        "passes": ",".join(opts.passes) or "none",
        "delegated_ops": info.num_delegated_nodes,
        "non_delegated_ops": info.num_non_delegated_nodes,
        "delegated_fraction": info.num_delegated_nodes / total if total else 0.0,
        "delegated_subgraphs": info.num_delegated_subgraphs,
    }


def constant_methods(description: dict[str, Any]) -> dict[str, Any]:
    """The description as JSON (METHOD), and the getters ExecuTorch's Llama runner reads
    (`get_max_seq_len`, ...) where they apply."""
    dims, cache = description["dims"], description["kv_cache"]
    methods: dict[str, Any] = {
        METHOD: json.dumps(description, sort_keys=True),
        "get_vocab_size": dims["vocab"],
        "get_n_layers": dims["layers"],
        "get_max_batch_size": description["phase"]["batch"],
        "use_kv_cache": cache["capacity"] is not None,
        "enable_dynamic_shape": cache["implementation"] == "dynamic" or bool(cache.get("in_graph")),
    }
    if cache["capacity"] is not None:
        methods["get_max_seq_len"] = cache["capacity"]
    return methods


def _mutated_buffers(edge: Any) -> int:
    """Buffers the lowered program writes (an in-graph KV cache), as the edge program's signature names them."""
    return len(edge.exported_program().graph_signature.buffers_to_mutate)


# -- the anatomy of a lowered edge program (the caller adds the .pte's artifact_bytes) ------------
CORE_NAMESPACES = ("aten", "dim_order_ops")  # other namespaces are custom ops (llama.update_cache)
FUNCTIONALIZED = ("auto_functionalized", "auto_functionalized_v2")  # a mutating custom op, wrapped


def _edge_op(target: Any, args: tuple = ()) -> str | None:
    """`aten.mul` for an edge or ATen op (`aten::mul.Tensor`), a functionalized mutating op by
    the op it wraps (`llama.update_cache`); None for the plumbing between them (getitem, the
    delegate call)."""
    if getattr(target, "__name__", None) in FUNCTIONALIZED and args:
        target = args[0]
    name = getattr(target, "_name", None)  # OpOverload / EdgeOpOverload: "aten::mul.Tensor"
    if not isinstance(name, str) or "::" not in name:
        return None
    namespace, op = name.split("::", 1)
    return f"{namespace}.{op.split('.')[0]}"


def _tensor_total(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


def anatomy(edge_program: Any) -> dict:
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
                op for n in inner.graph.nodes if n.op == "call_function" and (op := _edge_op(n.target, n.args))
            )
            ops.update(part)
            constants += _tensor_total(inner.state_dict.values()) + _tensor_total(inner.constants.values())
            partitions.append({"backend": lowered.backend_id, "ops": dict(sorted(part.items()))})
        elif node.op == "call_function" and (op := _edge_op(node.target, node.args)):
            ops[op] += 1
            outside[op] += 1
    embeddings = lookup_tables(edge_program, lambda n: _edge_op(n.target, n.args) == "aten.embedding")
    return summary(ops, outside, partitions, constants, 0, MOVEMENT, embeddings)


FORMAT = ExecutorchFormat()
