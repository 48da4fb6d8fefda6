"""Export cache entries that travel between nodes with no shared filesystem: packed once
where made (`pack`, one uncompressed tar), unpacked and verified where a benchmark needs
them (`localise`), in the node's own cache when it has one (`PHASESWEEP_NODE_CACHE`)."""

from __future__ import annotations

import io
import os
import shutil
import socket
import tarfile
import tempfile
from pathlib import Path

from tasks.worker.entries import MANIFEST, share_files, verify_entry

NODE_CACHE_ENV = "PHASESWEEP_NODE_CACHE"


def node_entry(planned: str) -> str:
    """Where this node keeps the entry the plan calls `planned`: in the node's own cache
    when it has one (the entry's folder name is its identity), else where planned."""
    own = os.environ.get(NODE_CACHE_ENV)
    if not own:
        return planned
    return str(Path(own).expanduser().resolve() / Path(planned).name)


def pack(entry: str | Path) -> bytes:
    """The sealed entry's files (manifest included) as one uncompressed tar."""
    entry = Path(entry)
    if verify_entry(entry) is not None:
        raise ValueError(f"{entry} is not a complete export cache entry: {verify_entry(entry)}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(p for p in entry.iterdir() if p.is_file()):
            tar.add(path, arcname=path.name)
    return buf.getvalue()


def localise(entry: str | Path, packed: bytes | None) -> str:
    """"local" when `entry` is there and verified; else unpack `packed` into it, verified, and
    return "fetched". Written in a temporary folder beside it and renamed into place, as an
    export is: a concurrent benchmark on the same node finds a whole entry or none."""
    entry = Path(entry)
    if verify_entry(entry) is None:
        return "local"
    if packed is None:
        raise FileNotFoundError(f"{entry}: not in this node's export cache ({verify_entry(entry)}) and nothing was sent")
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.{socket.gethostname()}.{os.getpid()}.", dir=entry.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r") as tar:
            tar.extractall(tmp, filter="data")
        why = verify_entry(tmp)
        if why is not None or not (tmp / MANIFEST).is_file():
            raise ValueError(f"the export sent for {entry.name} does not verify: {why}")
        share_files(tmp)  # as where it was made: its weights once in this node's cache
        shutil.rmtree(entry, ignore_errors=True)  # untrusted leftovers
        try:
            tmp.rename(entry)
        except OSError:  # another benchmark on this node placed it first
            if verify_entry(entry) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return "fetched"
