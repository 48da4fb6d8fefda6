"""tasks/worker/transfer.py: an export cache entry packed where it was made, unpacked (verified) on
a node whose own cache lacks it; and where each node keeps its entries."""

from __future__ import annotations

import io
import tarfile

import pytest

from tasks.worker.entries import verify_entry, write_manifest
from tasks.worker.transfer import NODE_CACHE_ENV, localise, node_entry, pack


@pytest.fixture
def entry(tmp_path):
    folder = tmp_path / "made" / "llama_decode_onnx-0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"graph" * 1000)
    (folder / "meta.json").write_text('{"artifact": "model.onnx"}')
    write_manifest(folder)
    return folder


def test_an_entry_travels_whole_and_verified(entry, tmp_path):
    there = tmp_path / "other-node" / entry.name
    assert localise(there, pack(entry)) == "fetched"
    assert verify_entry(there) is None
    assert {p.name for p in there.iterdir()} == {p.name for p in entry.iterdir()}
    assert (there / "model.onnx").read_bytes() == (entry / "model.onnx").read_bytes()
    assert localise(there, None) == "local"  # kept: the next benchmark there finds it
    assert not [p for p in there.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_what_does_not_verify_is_refused_and_nothing_is_placed(entry, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # the manifest of the entry, a file changed
        tar.add(entry / "manifest.json", arcname="manifest.json")
        tar.add(entry / "meta.json", arcname="meta.json")
        data = b"other" * 1000
        info = tarfile.TarInfo("model.onnx")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    there = tmp_path / "other-node" / entry.name
    with pytest.raises(ValueError, match="does not verify: model.onnx does not match its checksum"):
        localise(there, buf.getvalue())
    assert not there.exists() and not list(there.parent.iterdir())


def test_a_missing_entry_with_nothing_sent_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="not in this node's export cache"):
        localise(tmp_path / "nowhere", None)


def test_an_incomplete_entry_is_not_packed(entry):
    (entry / "manifest.json").unlink()
    with pytest.raises(ValueError, match="not a complete export cache entry"):
        pack(entry)


def test_a_node_with_its_own_cache_keeps_entries_there(monkeypatch, tmp_path):
    planned = "/driver/.phasesweep_cache/llama_decode_onnx-0123456789abcdef"
    monkeypatch.delenv(NODE_CACHE_ENV, raising=False)
    assert node_entry(planned) == planned
    monkeypatch.setenv(NODE_CACHE_ENV, str(tmp_path / "node"))
    assert node_entry(planned) == str(tmp_path / "node" / "llama_decode_onnx-0123456789abcdef")
