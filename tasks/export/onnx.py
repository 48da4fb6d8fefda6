"""ONNX, with named inputs and outputs, by one of two exporters (backend.export_options.exporter):
torch.onnx.export(dynamo=True) of phasesweep's graph, or onnxruntime-genai's model builder
(tasks/export/_genai.py), ONNX Runtime's own LLM exporter with its fused contrib ops."""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.contract import ExportFormat, Point, Refusal
from tasks.export import _genai, _onnx_quant
from tasks.export._anatomy import summary
from tasks.export._weights import canonical_external_data
from tasks.specs import DEVICES, at_least, choice

if TYPE_CHECKING:
    import torch

EXTERNAL_DATA_BYTES = 1 << 30  # weights past this go to an external file (protobuf's 2 GiB limit)
_NO_LLAMA_OPS = "ONNX has no llama::update_cache / custom_sdpa (ExecuTorch's LLM custom ops)"
# data-movement ops by ONNX op type (tasks/export/_anatomy.py)
MOVEMENT = {
    "transposes": frozenset({"Transpose"}),
    "copies": frozenset({"Identity", "Expand", "Tile"}),
    "casts": frozenset({"Cast", "CastLike"}),
}
EXPORTERS = ("torch", "genai")
# ops whose counts show what an exporter and ONNX Runtime's optimiser fused (ort_graph_* metrics),
# by op type whatever its domain
FUSED = (
    "GroupQueryAttention",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "MatMul",
    "FusedMatMul",
    "ScatterND",
)


@dataclass(frozen=True)
class Options:
    opset: int | None = None  # None: the exporter's default opset
    optimize: bool = True  # onnxscript graph optimizations after export
    exporter: str = "torch"  # torch: torch.onnx of phasesweep's graph | genai: onnxruntime-genai's model builder
    # torch exporter: ONNX Runtime's contrib ops: attention and cache update as GroupQueryAttention,
    # RMSNorm (and the residual add before it) as (Skip)SimplifiedLayerNormalization
    ort_fusions: bool = True

    def __post_init__(self) -> None:
        at_least("backend.export_options.opset", self.opset, 18, optional=True)
        choice("backend.export_options.exporter", self.exporter, EXPORTERS)


def export(
    graph: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    options: dict[str, Any],
    description: dict[str, Any],
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    # lazy: onnx, only in a job's process
    import onnx

    opts = Options(**options)
    path = out_dir / "model.onnx"
    quant, group = description["model"].get("quant", "none"), description["model"].get("quant_group", 32)
    if opts.exporter == "genai":
        return _export_genai(graph, path, description)
    details = _torch_export(graph, args, input_names, output_names, path, opts)
    if quant != "none":  # after the export and its optimisation, as ONNX Runtime's quantiser expects
        details.update(_onnx_quant.quantize_file(path, quant, group, EXTERNAL_DATA_BYTES))
        description = {**description, "quant": quant_description(quant, group, details)}
    proto = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    onnx.helper.set_model_props(proto, metadata(description))
    if not canonical_external_data(path, proto):  # saves proto; the weights laid out by their bytes
        onnx.save(proto, str(path))
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    details.update(onnx_nodes=len(proto.graph.node), onnx_opset=opset)
    return path.name, details, anatomy(path)


def _torch_export(graph, args, input_names, output_names, path: Path, opts: Options) -> dict[str, Any]:
    """torch.onnx.export of the phase graph to `path`, with ONNX Runtime's fused ops where
    opts.ort_fusions and the graph allow (tasks/export/_ort_attention.py): its attention and
    cache update as com.microsoft.GroupQueryAttention, then onnxscript's ORT fusions. Returns
    the fusions' details."""
    # lazy: torch, only in a job's process
    import torch

    # lazy: they import torch or its kin, which this module's importers (the driver) must not
    from tasks.export import _ort_attention
    from tasks.export._shapes import dynamic_shapes
    from tasks.model.cached_attention import fused_attention, unfusable

    why = unfusable(graph) if opts.ort_fusions else "backend.export_options.ort_fusions=false"
    fused = contextlib.nullcontext(0) if why else fused_attention(graph)
    external = sum(p.numel() * p.element_size() for p in graph.parameters()) > EXTERNAL_DATA_BYTES
    logging.getLogger("torch.onnx").setLevel(logging.WARNING)
    with fused as layers, torch.inference_mode(False), torch.no_grad():
        program = torch.onnx.export(
            graph,
            args,
            str(path) if why else None,  # fused: saved once, after the fusions, not written and read back
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes(graph, args, input_names),
            opset_version=opts.opset,
            external_data=external,
            optimize=opts.optimize,
            verbose=False,
            custom_translation_table=None if why else _ort_attention.translation_table(),
        )
    if why:
        return {"onnx_fused_attention_layers": 0, "onnx_ort_fusions_skip": why}
    counts = _ort_attention.fuse_for_ort(program.model, path, external)
    return {"onnx_fused_attention_layers": layers, "onnx_ort_fusions": ",".join(f"{k}={n}" for k, n in counts.items())}


def quant_description(quant: str, group: int, details: dict[str, Any]) -> dict[str, Any]:
    """The file's own account of its quantisation (the description's `quant`), from the
    quantiser's details (onnx_quant_*)."""
    return {
        "quant": quant,
        "quant_group": group,
        "op": "com.microsoft.MatMulNBits",
        "bits": details["onnx_quant_bits"],
        "block_size": details["onnx_quant_blocks"],
        "accuracy_level": details["onnx_quant_accuracy_level"],
        "symmetric": True,
        "by": details["onnx_quant_by"],
    }


def _export_genai(graph: Any, path: Path, description: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The builder's model of the graph's transformers model (its weights), described with
    the file's own inputs and outputs."""
    # lazy: onnx, only in a job's process
    import onnx

    m = description["model"]
    quant, group = m.get("quant", "none"), m.get("quant_group", 32)
    details = _genai.build(graph.lm, m["family"], m["dtype"], m.get("checkpoint"), path.parent, quant, group)
    proto = onnx.load(str(path), load_external_data=False)
    description = {**description, "exporter": "genai", **_io(proto)}
    if quant != "none":
        description["quant"] = quant_description(quant, group, details)
    onnx.helper.set_model_props(proto, metadata(description))
    onnx.save(proto, str(path))
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return path.name, {**details, "onnx_nodes": len(proto.graph.node), "onnx_opset": opset}, anatomy(path)


def _io(proto: Any) -> dict[str, Any]:
    """{"inputs": {name: {shape, dtype}}, "outputs": ...} of an ONNX graph; symbolic dims by name."""
    # lazy: onnx, only in a job's process
    import onnx

    def side(values: Any) -> dict[str, Any]:
        out = {}
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param or d.dim_value for d in t.shape.dim]
            out[v.name] = {"shape": shape, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name}
        return out

    return {"inputs": side(proto.graph.input), "outputs": side(proto.graph.output)}


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
    """Its bytes as stored: external data's length, raw bytes, else its elements at their
    width (4-bit types two to a byte)."""
    # lazy: onnx, only in a job's process
    import onnx

    for entry in t.external_data:
        if entry.key == "length":
            return int(entry.value)
    if t.raw_data:
        return len(t.raw_data)
    n = 1
    for d in t.dims:
        n *= d
    packed = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, getattr(onnx.TensorProto, "FLOAT4E2M1", -1)}
    if t.data_type in packed:
        return (n + 1) // 2
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


# (op type, input) that reads a constant by row: an embedding table, a rotary cos/sin cache
ROW_READS = frozenset(
    {
        ("Gather", 0),
        ("GroupQueryAttention", 7),
        ("GroupQueryAttention", 8),
        ("RotaryEmbedding", 2),
        ("RotaryEmbedding", 3),
    }
)


def _lookups(graph: Any, sizes: dict[str, int]) -> list[dict[str, int]]:
    """The initializers only ever read by row (ROW_READS; a Gather on axis 0), with their rows."""
    readers: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        for i, name in enumerate(node.input):
            if name in sizes:
                readers.setdefault(name, set()).add((node.op_type if axis == 0 else "", i))
    dims = {t.name: list(t.dims) for t in graph.initializer}
    return [
        {"bytes": sizes[name], "rows": dims[name][0]}
        for name, how in readers.items()
        if how <= ROW_READS and len(dims[name]) == 2
    ]


def fused_counts(anatomy: dict) -> dict[str, int]:
    """{op type: count} of FUSED in an anatomy, whatever the op's domain."""
    counts = dict.fromkeys(FUSED, 0)
    for op, n in anatomy["ops"].items():
        kind = op.rsplit(".", 1)[-1]
        if kind in counts:
            counts[kind] += n
    return counts


def anatomy(path: str | Path) -> dict:
    """The anatomy of an .onnx file (its external data is never read)."""
    # lazy: onnx, only in a job's process
    import onnx

    path = Path(path)
    proto = onnx.load(str(path), load_external_data=False)
    ops: Counter = Counter()
    _graph_ops(proto.graph, ops)
    for fn in proto.functions:  # local functions the exporter kept
        for node in fn.node:
            ops[_op(node)] += 1
    sizes = {t.name: _tensor_bytes(t) for t in proto.graph.initializer}
    constants = sum(sizes.values())
    constants += sum(
        _tensor_bytes(a.t) for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")
    )
    files = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return summary(ops, Counter(), [], constants, files, MOVEMENT, _lookups(proto.graph, sizes))


class OnnxFormat(ExportFormat):
    LIBRARIES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime-genai")
    REQUIRES = ("onnx", "onnxscript")
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
        "onnxscript.rewriter.ort_fusions",
        "tasks.export._ort_attention",
        "tasks.model.cached_attention",
    )
    MEMORY_FACTOR = 1.5  # an export's peak memory, as a multiple of the weights
    RESOURCES = {"num_cpus": 1}
    MOVEMENT = MOVEMENT
    Options = Options
    # ONNX Runtime's own quantiser, or the genai builder's int4/int8, makes these for a file any
    # device loads (tasks/export/_onnx_quant.py); runtimes say what runs
    QUANTS = dict.fromkeys(DEVICES, ("none", "int8", "int4", "8da4w"))
    QUANT_NOTE = "ONNX weight quantisation is MatMulNBits (tasks/export/_onnx_quant.py); q4_k_m is llama.cpp's own type"
    REFUSALS = (
        Refusal("model.kv_cache", "update_cache", _NO_LLAMA_OPS),
        Refusal("model.attention", "custom_sdpa", _NO_LLAMA_OPS),
    )

    def limits(self, point: Point) -> str | None:
        """The quantiser's group sizes, and the genai exporter's families, devices and dtypes."""
        if why := _onnx_quant.unsupported(point.model.quant, point.model.quant_group):
            return why
        return _genai.unsupported(point.model, point.phase, point.device) if self.genai(point.export_options) else None

    @staticmethod
    def genai(options: Any) -> bool:
        return options.get("exporter") == "genai"

    def name_tag(self, options: Any) -> str:
        """What the variant's name adds after the backend's: `onnxruntime_genai` for the builder's model."""
        return "genai" if self.genai(options) else ""

    def export(self, graph, args, input_names, output_names, out_dir, options, description):
        return export(graph, args, input_names, output_names, out_dir, options, description)


FORMAT = OnnxFormat()
