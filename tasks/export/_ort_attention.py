"""phasesweep::cached_attention (tasks/model/cached_attention.py) as ONNX Runtime's
com.microsoft.GroupQueryAttention, for torch.onnx.export's custom_translation_table.

GroupQueryAttention takes the step's query, keys and values packed [B, S, heads * D], the past
cache [B, H_kv, S_past, D], seqlens_k (per sequence, the last new position) and
total_sequence_length, and returns the output [B, S, H * D] and the present cache. A static
buffer keeps its length (present [B, H_kv, S_max, D]); bound as both past and present (IO
binding, tasks/export/onnx_io.py), it is written in place and only its filled slots are read,
as onnxruntime-genai's past_present_share_buffer does. Without a past (a prompt) present is the
prompt's own keys; with a dynamic past it grows by S.

The op has no schema in onnx's registry (it is ONNX Runtime's contrib op): SCHEMA declares the
inputs and attributes used here (onnx.defs.OpSchema, a public constructor) so onnxscript can
record the node. Imports onnx and onnxscript: only in an export's process.

fuse_for_ort then runs onnxscript's ONNX Runtime fusions (optimize_for_ort) over the exported
model in memory, and saves it: RMSNorm as SimplifiedLayerNormalization, a residual add and
RMSNorm as SkipSimplifiedLayerNormalization (the builder's own ops), about 5% of a decode step
at context 128 on the 125M Llama (docs/measurement.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import onnxscript
from onnx.defs import OpSchema
from onnxscript import opset18 as op

if TYPE_CHECKING:
    import onnx_ir

_P, _A = OpSchema.FormalParameter, OpSchema.Attribute
_OPTIONAL = OpSchema.FormalParameterOption.Optional
SCHEMA = OpSchema(
    "GroupQueryAttention",
    "com.microsoft",
    1,
    inputs=[
        _P("query", "T"),
        _P("key", "T"),
        _P("value", "T"),
        _P("past_key", "T", param_option=_OPTIONAL),
        _P("past_value", "T", param_option=_OPTIONAL),
        _P("seqlens_k", "M"),
        _P("total_sequence_length", "M"),
    ],
    outputs=[_P("output", "T"), _P("present_key", "T"), _P("present_value", "T")],
    type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""), ("M", ["tensor(int32)"], "")],
    attributes=[
        _A("num_heads", OpSchema.AttrType.INT, "query heads"),
        _A("kv_num_heads", OpSchema.AttrType.INT, "key/value heads"),
        _A("scale", OpSchema.AttrType.FLOAT, "score scale"),
        _A("softcap", OpSchema.AttrType.FLOAT, "softcap * tanh(scores / softcap); 0: none"),
        _A("local_window_size", OpSchema.AttrType.INT, "the keys a query sees, its own included; -1: all"),
    ],
)
GROUP_QUERY_ATTENTION = onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), "GroupQueryAttention", SCHEMA)


def _packed(x: Any) -> Any:
    """[B, H, S, D] -> [B, S, H * D]."""
    return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))


def translate(q, k, v, k_past, v_past, cache_position, cache: str, scale: float, softcap: float, window: int):
    """GroupQueryAttention on cached_attention's arguments: (out, present key, present value)."""
    last = op.Slice(cache_position, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**62]))  # [1] int64
    seqlens_k = op.Cast(op.Expand(last, op.Shape(q, start=0, end=1)), to=onnx.TensorProto.INT32)  # [B]
    total = op.Cast(op.Squeeze(op.Add(last, op.Constant(value_ints=[1]))), to=onnx.TensorProto.INT32)  # scalar
    out, k_all, v_all = GROUP_QUERY_ATTENTION(
        _packed(q),
        _packed(k),
        _packed(v),
        k_past,
        v_past,
        seqlens_k,
        total,
        num_heads=q.shape[1],
        kv_num_heads=k.shape[1],
        scale=float(scale),
        softcap=float(softcap),
        local_window_size=window if window else -1,  # ONNX Runtime counts the query's own key in it
    )
    return out, k_all, v_all


def fuse_for_ort(model: onnx_ir.Model, path: Path, external: bool) -> dict[str, int]:
    """optimize_for_ort over the exported `model` (torch.onnx's ONNXProgram.model), then saved
    to `path` (its weights to path.name + ".data" when `external`); {fusion: count} of the
    fusions that applied."""
    # lazy: onnx_ir, only in an export's process
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, counts = optimize_for_ort(model)
    ir.save(model, str(path), external_data=path.name + ".data" if external else None)
    return {name: n for name, n in counts.items() if n}


def translation_table() -> dict[Any, Any]:
    """torch.onnx.export's custom_translation_table for a graph built under fused_attention."""
    # lazy: torch, only in an export's process
    import torch

    # lazy: it imports torch; importing it registers phasesweep::cached_attention
    import tasks.model.cached_attention  # noqa: F401

    return {torch.ops.phasesweep.cached_attention.default: translate}
