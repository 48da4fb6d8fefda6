"""An ONNX file's external weights laid out by their bytes alone, so that two graphs of one
model (prefill's and decode's: the same weights under other initializer names, in another
order) write byte-identical data files, which the export cache keeps once
(tasks/worker/entries.py share_files). Small tensors, where a phase's own constants are, go
inside the graph. Streamed: one chunk in memory at a time. A model whose graphs differ in a
large tensor simply keeps two data files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

ALIGN = 4096  # each tensor starts on a page, as the exporter places them (ONNX Runtime maps pages)
CHUNK = 64 << 20
INLINE_BYTES = 1 << 20  # smaller tensors are stored in the graph itself


def _ranges(f: Any, offset: int, length: int):
    f.seek(offset)
    while length > 0:
        chunk = f.read(min(CHUNK, length))
        if not chunk:
            raise ValueError(f"external data ends before offset {offset} + {length}")
        length -= len(chunk)
        yield chunk


def canonical_external_data(path: Path, proto: Any) -> bool:
    """Rewrite `proto`'s one external data file, its tensors of INLINE_BYTES or more ordered by
    the sha256 of their bytes and the smaller ones moved into the graph, and save `proto`
    (loaded without its external data) to `path`. False, and nothing changed, when it holds
    no external tensor or names more than one file."""
    # lazy: onnx, only in a job's process
    import onnx

    tensors = [t for t in proto.graph.initializer if t.external_data]
    facts = [{e.key: e.value for e in t.external_data} for t in tensors]
    locations = {f.get("location") for f in facts}
    if not tensors or len(locations) != 1:
        return False
    data = path.parent / locations.pop()
    tmp = data.with_name(data.name + ".canonical")
    order = []
    with data.open("rb") as f:
        for t, fact in zip(tensors, facts, strict=True):
            chunks = _ranges(f, int(fact.get("offset", 0)), int(fact["length"]))
            if int(fact["length"]) < INLINE_BYTES:
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
                t.raw_data = b"".join(chunks)
                continue
            h = hashlib.sha256()
            for chunk in chunks:
                h.update(chunk)
            order.append((h.hexdigest(), t, fact))
        order.sort(key=lambda item: item[0])
        with tmp.open("wb") as out:
            for _, t, fact in order:
                out.write(b"\0" * (-out.tell() % ALIGN))
                start = out.tell()
                for chunk in _ranges(f, int(fact.get("offset", 0)), int(fact["length"])):
                    out.write(chunk)
                del t.external_data[:]
                for key, value in (("location", data.name), ("offset", str(start)), ("length", fact["length"])):
                    t.external_data.add(key=key, value=value)
    os.replace(tmp, data)
    onnx.save(proto, str(path))
    return True
