"""An export's cache entry: a folder sealed by a manifest of its files' sizes and checksums,
written last, so an entry without one is incomplete. Stdlib and numpy only."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np

from tasks.measure.machine import alive
from tasks.specs import CONTEXT, ExportResult, ExportSpec

META = "meta.json"
MANIFEST = "manifest.json"
CHECKSUM_BYTES = 1 << 30  # larger files (external weights) are verified by size only
INPUTS = "inputs.npz"  # the timed call's feeds, by graph input name
PARITY = "parity.npz"  # step tokens and reference logits
SERIES = "series_{}.npz"  # a series step's (decode: a cache depth's) feeds and parity data, keys feed/* and parity/*


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(entry: Path) -> None:
    files = sorted(p for p in entry.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {p.name: {"bytes": p.stat().st_size, "sha256": _digest(p)} for p in files}
    (entry / MANIFEST).write_text(json.dumps(manifest, indent=1))


SHARED = ".shared"  # in the cache folder: one name per distinct large file, its sha256
SHARE_BYTES = 1 << 20  # files this large are kept once across the cache's entries


def share_files(entry: Path) -> int:
    """A sealed entry's large files that another entry of the cache holds with the same bytes
    (a model's weights, for its prefill and its decode graph) become hard links to those bytes,
    named by checksum in <cache>/.shared/; a name there no entry links to any more is removed.
    Entries are never written once sealed, so sharing is safe. Returns the bytes it saved; a
    file system without hard links saves nothing and changes nothing."""
    pool, saved = entry.parent / SHARED, 0
    manifest = json.loads((entry / MANIFEST).read_text())
    for name, want in manifest.items():
        if want["bytes"] < SHARE_BYTES:
            continue
        path, blob = entry / name, pool / want["sha256"]
        try:
            pool.mkdir(exist_ok=True)
            if blob.is_file() and blob.stat().st_size == want["bytes"]:
                os.link(blob, entry / f".{name}.shared")
                os.replace(entry / f".{name}.shared", path)
                saved += want["bytes"]
            else:
                os.link(path, blob)
        except OSError:  # no hard links here, or another export's race: this entry keeps its own
            (entry / f".{name}.shared").unlink(missing_ok=True)
    for blob in pool.iterdir() if pool.is_dir() else ():
        try:
            if blob.stat().st_nlink == 1:
                blob.unlink()
        except OSError:
            pass
    return saved


def verify_entry(entry: Path) -> str | None:
    """Why a cache entry cannot be trusted (missing, partial, corrupt), or None."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable manifest.json (an export that did not finish)"
    for name, want in manifest.items():
        path = entry / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, the manifest says {want['bytes']}"
        if size <= CHECKSUM_BYTES and _digest(path) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def clean_dead_temporaries(parent: Path, name: str) -> None:
    """Temporary folders of exports whose process is gone (killed, timed out) on this host."""
    host = socket.gethostname()
    for tmp in parent.glob(f".{name}.*"):
        parts = tmp.name.split(".")  # "", name, host, pid, random
        if len(parts) >= 5 and parts[-3] == host and parts[-2].isdigit() and not alive(int(parts[-2])):
            shutil.rmtree(tmp, ignore_errors=True)


def result_from_meta(spec: ExportSpec, out: Path, cache_hit: bool) -> ExportResult:
    meta = json.loads((out / META).read_text())
    return ExportResult(
        key=spec.key,
        out_dir=str(out),
        ok=True,
        cache_hit=cache_hit,
        artifact=str(out / meta["artifact"]) if meta["artifact"] else None,
        export_seconds=meta["export_seconds"],
        artifact_mb=meta["artifact_mb"],
        input_shapes=meta["input_shapes"],
        details=meta["details"],
        anatomy=meta.get("anatomy"),
    )


def cached_export(spec: ExportSpec, entry: str | Path) -> ExportResult | None:
    """The result of a complete, verified entry at `entry` (a cache hit), else None. Torch-free:
    the driver reads its cache hits itself."""
    out = Path(entry)
    if out.exists() and verify_entry(out) is None:
        return result_from_meta(spec, out, cache_hit=True)
    return None


def load_export(export_dir: str | Path) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An entry's (meta, the timed call's feeds in input order, parity data)."""
    export_dir = Path(export_dir)
    meta = json.loads((export_dir / META).read_text())
    with np.load(export_dir / INPUTS) as z:
        feeds = {name: z[name] for name in (*meta["input_names"], *[CONTEXT] * (CONTEXT in z.files))}  # + an in-graph cache's fill
    with np.load(export_dir / PARITY) as z:
        parity = {name: z[name] for name in z.files}
    return meta, feeds, parity


def save_series(entry: Path, series: dict[int, Any]) -> None:
    """Each series step's data (a PhaseData) as SERIES beside the headline's INPUTS and PARITY."""
    for step, data in series.items():
        arrays = {f"feed/{n}": a for n, a in data.feeds.items()} | {f"parity/{n}": a for n, a in data.parity.items()}
        np.savez(entry / SERIES.format(step), **arrays)


def load_series(export_dir: str | Path, step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A series step's (feeds in the file's order, parity data), as save_series wrote them."""
    with np.load(Path(export_dir) / SERIES.format(step)) as z:
        feeds = {n.removeprefix("feed/"): z[n] for n in z.files if n.startswith("feed/")}
        parity = {n.removeprefix("parity/"): z[n] for n in z.files if n.startswith("parity/")}
    return feeds, parity
