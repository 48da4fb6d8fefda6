"""What a .pte stores, read from the file and its edge program (tasks/export/executorch.py).

A .pte keeps its constants, its delegates' blobs (XNNPACK's weights, packed as XNNPACK
serialises them: int4 two to a byte, with their scales) and named data in segments after
the program. The extended header at byte 8 (ExecuTorch's documented .pte layout: magic
`eh00`, its length, program size, segment base offset, segment data size; little-endian)
records their total, so the count is the file's own, whatever quantisation made it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADER_AT = 8
MAGIC = b"eh00"
SEGMENT_SIZE_AT = HEADER_AT + 24  # after magic, length (4 + 4), program size, segment base (8 + 8)


def segment_bytes(path: str | Path) -> int | None:
    """Bytes of the .pte's segments as its header records them; None when it records none
    (no segments: the constants are inside the program)."""
    with Path(path).open("rb") as f:
        head = f.read(SEGMENT_SIZE_AT + 8)
    if len(head) < SEGMENT_SIZE_AT + 8 or head[HEADER_AT : HEADER_AT + 4] != MAGIC:
        return None
    length = int.from_bytes(head[HEADER_AT + 4 : HEADER_AT + 8], "little")
    if length < SEGMENT_SIZE_AT + 8 - HEADER_AT:  # an older header without the segment size
        return None
    return int.from_bytes(head[SEGMENT_SIZE_AT : SEGMENT_SIZE_AT + 8], "little") or None


def lookup_tables(edge_program: Any, is_embedding: Any) -> list[dict[str, int]]:
    """The constant tables the program reads by row outside its delegates (the node filter
    `is_embedding`: aten.embedding), as stored: [{"bytes", "rows"}]."""
    signature = edge_program.graph_signature
    named = {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **signature.inputs_to_lifted_tensor_constants,
    }
    tensors = {**edge_program.state_dict, **edge_program.constants}
    out = []
    for node in edge_program.graph_module.graph.nodes:
        if node.op != "call_function" or not is_embedding(node) or not node.args:
            continue
        table = node.args[0]
        tensor = tensors.get(named.get(getattr(table, "name", None)))
        if tensor is not None and tensor.dim() == 2:
            out.append({"bytes": tensor.numel() * tensor.element_size(), "rows": tensor.shape[0]})
    return out
