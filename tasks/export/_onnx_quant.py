"""model.quant on an ONNX file, by ONNX Runtime's own weight-only quantiser
(onnxruntime.quantization.matmul_nbits_quantizer): every MatMul with a constant weight
becomes a MatMulNBits holding the weight packed along K in blocks, one scale per block,
symmetric (no zero points), as ONNX Runtime GenAI's model builder makes it. Embedding
lookups (Gather) stay in the model's dtype; a tied output head gets its own packed copy.

  int4   4-bit blocks of model.quant_group, float activations (accuracy_level unset: fp32)
  8da4w  the same weights, accuracy_level=4: ONNX Runtime quantises the activations to int8
         per call and multiplies in int8 (the builder's int4 default on CPU)
  int8   8-bit blocks of 256 along K (or K itself when smaller): the nearest to per channel
         MLAS quantises (blocks of 16 to 256)

Torch-free, and onnxruntime is imported only to quantise: the planner asks unsupported()
through tasks/export/onnx.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

BLOCKS = (16, 32, 64, 128, 256)  # the blocks MLAS's blockwise quantiser takes
INT8_BLOCK, MIN_BLOCK = BLOCKS[-1], BLOCKS[0]
# quant -> (bits, accuracy_level); accuracy_level None leaves the attribute out (fp32 compute)
SETTINGS = {"int8": (8, None), "int4": (4, None), "8da4w": (4, 4)}
# the genai builder's precision and extra options for each quant (its own MatMulNBits path)
GENAI = {"int8": ("int8", 1), "int4": ("int4", 1), "8da4w": ("int4", 4)}


def unsupported(quant: str, group: int) -> str | None:
    """Why ONNX Runtime's quantiser cannot make this quant and group (a planned skip), or None."""
    if quant in ("int4", "8da4w") and group not in BLOCKS:
        return (
            f"model.quant_group={group}: ONNX Runtime's MatMulNBits quantiser (MLAS) takes blocks of "
            f"{', '.join(map(str, BLOCKS))} along K"
        )
    return None


def block_size(quant: str, group: int, k: int) -> int:
    """The MatMulNBits block along K for a weight with K rows."""
    if quant == "int8":
        return max(MIN_BLOCK, min(INT8_BLOCK, 1 << (k - 1).bit_length()))
    return group


def genai_options(quant: str, group: int) -> tuple[str, list[str], dict[str, Any]]:
    """(precision, extra options, details) of the builder for `quant` != "none"."""
    precision, level = GENAI[quant]
    block = INT8_BLOCK if quant == "int8" else group
    details = {
        "onnx_quant_bits": SETTINGS[quant][0],
        "onnx_quant_blocks": str(block),
        "onnx_quant_accuracy_level": level,
        "onnx_quant_by": "onnxruntime-genai model builder",
    }
    return precision, [f"accuracy_level={level}", f"block_size={block}", "is_symmetric=true"], details


def _constant_matmuls(graph: Any) -> dict[str, int]:
    """{node name: K} of the MatMuls whose weight (input 1) is a 2-D initializer."""
    dims = {t.name: list(t.dims) for t in graph.initializer}
    return {
        n.name: dims[n.input[1]][0] for n in graph.node if n.op_type == "MatMul" and len(dims.get(n.input[1], ())) == 2
    }


def _untie_transposed_weights(graph: Any) -> int:
    """A MatMul that reads a 2-D initializer through a Transpose (a tied output head reads
    the embedding table so) gets the transposed weight as its own initializer, which the
    quantiser packs, as the builder quantises a tied head; the Gather keeps the float table.
    Returns how many were untied."""
    # lazy: onnx, only in a job's process
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, int] = {}
    for n in graph.node:
        for name in n.input:
            consumers[name] = consumers.get(name, 0) + 1
    transposed = {
        n.output[0]: n
        for n in graph.node
        if n.op_type == "Transpose"
        and n.input[0] in inits
        and len(inits[n.input[0]].dims) == 2
        and [a.ints for a in n.attribute if a.name == "perm"] in ([], [[1, 0]])
    }
    untied = 0
    for n in graph.node:
        if n.op_type != "MatMul" or n.input[1] not in transposed:
            continue
        transpose = transposed[n.input[1]]
        weight = numpy_helper.from_array(numpy_helper.to_array(inits[transpose.input[0]]).T.copy(), n.input[1] + "_weight")
        graph.initializer.append(weight)
        n.input[1] = weight.name
        consumers[transpose.output[0]] -= 1
        untied += 1
    for out, transpose in transposed.items():
        if consumers.get(out, 0) == 0:
            graph.node.remove(transpose)
    return untied


def quantize(proto: Any, quant: str, group: int) -> dict[str, Any]:
    """Quantise `proto` (loaded with its weights) in place; details for the export's meta."""
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    # the module calls logging.basicConfig(level=INFO) when imported: the root logger put back
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    root.handlers[:], root.level = handlers, root_level
    bits, level = SETTINGS[quant]
    untied = _untie_transposed_weights(proto.graph)
    nodes = _constant_matmuls(proto.graph)
    unnamed = [n for n in proto.graph.node if n.op_type == "MatMul" and not n.name]
    if unnamed:
        raise ValueError(f"{len(unnamed)} MatMul nodes have no name: the quantiser selects nodes by name")
    by_block: dict[int, set[str]] = {}
    for name, k in nodes.items():
        by_block.setdefault(block_size(quant, group, k), set()).add(name)
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level_before, quiet.level = quiet.level, logging.WARNING
    try:
        for block, names in sorted(by_block.items()):  # one pass per block size, the others excluded
            q = MatMulNBitsQuantizer(
                proto,
                bits=bits,
                block_size=block,
                is_symmetric=True,
                accuracy_level=level,
                nodes_to_exclude=[n.name for n in proto.graph.node if n.op_type == "MatMul" and n.name not in names],
                op_types_to_quantize=("MatMul",),
            )
            q.process()  # rewrites proto's graph in place
    finally:
        quiet.setLevel(level_before)
    done = sum(1 for n in proto.graph.node if n.op_type == "MatMulNBits")
    return {
        "onnx_quant_bits": bits,
        "onnx_quant_blocks": ",".join(map(str, sorted(by_block))),
        "onnx_quant_accuracy_level": level or 0,
        "onnx_quant_matmuls": done,
        "onnx_float_matmuls": sum(1 for n in proto.graph.node if n.op_type == "MatMul"),
        "onnx_quant_untied": untied,
        "onnx_quant_by": "onnxruntime.quantization.matmul_nbits_quantizer",
    }


def quantize_file(path: Path, quant: str, group: int, external_bytes: int) -> dict[str, Any]:
    """Rewrite the ONNX file at `path` quantised: its weights loaded, quantised, saved again
    (external data past `external_bytes`, one file, as the exporter writes it)."""
    # lazy: onnx, only in a job's process
    import onnx

    proto = onnx.load(str(path))  # with its external data, if any
    for old in path.parent.glob(path.name + ".data"):
        old.unlink()
    details = quantize(proto, quant, group)
    if proto.ByteSize() > external_bytes:
        onnx.save(
            proto,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save(proto, str(path))
    return details
