"""A model's weights once on disk: its graphs' external data laid out by their bytes alone
(tasks/export/_weights.py) and kept once across the export cache's entries by hard link
(tasks/worker/entries.py share_files)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.export import _weights
from tasks.export._weights import canonical_external_data
from tasks.worker import entries
from tasks.worker.entries import SHARED, share_files, verify_entry, write_manifest

RNG = np.random.default_rng(0)
W1, W2 = RNG.standard_normal((64, 64), dtype=np.float32), RNG.standard_normal((64, 64), dtype=np.float32)


def graph_file(folder: Path, names: tuple[str, str], order: tuple[int, int], extra: float) -> Path:
    """y = (x @ W1 + c) @ W2, its weights named `names`, listed in `order`, saved as external
    data the way the exporter saves them; `c` is a small constant of the graph's own."""
    inits = [numpy_helper.from_array(W1, names[0]), numpy_helper.from_array(W2, names[1])]
    inits = [inits[i] for i in order] + [numpy_helper.from_array(np.full(64, extra, np.float32), "c")]
    nodes = [
        helper.make_node("MatMul", ["x", names[0]], ["h"]),
        helper.make_node("Add", ["h", "c"], ["h2"]),
        helper.make_node("MatMul", ["h2", names[1]], ["y"]),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_two_graphs_of_one_models_weights_write_one_data_file(tmp_path, monkeypatch):
    monkeypatch.setattr(_weights, "INLINE_BYTES", 1024)  # the 256-byte constants go inside the graphs
    a = graph_file(tmp_path / "a", ("w_a", "w_b"), (0, 1), extra=1.0)  # prefill-like: its own names and order
    b = graph_file(tmp_path / "b", ("val_7", "val_3"), (1, 0), extra=2.0)
    x = RNG.standard_normal((1, 64), dtype=np.float32)
    before = run(a, x), run(b, x)
    assert (a.parent / "model.onnx.data").read_bytes() != (b.parent / "model.onnx.data").read_bytes()
    for path in (a, b):
        assert canonical_external_data(path, onnx.load(str(path), load_external_data=False))
    assert (a.parent / "model.onnx.data").read_bytes() == (b.parent / "model.onnx.data").read_bytes()
    np.testing.assert_array_equal(run(a, x), before[0])
    np.testing.assert_array_equal(run(b, x), before[1])
    proto = onnx.load(str(a), load_external_data=False)
    inline = [t.name for t in proto.graph.initializer if not t.external_data]
    assert inline == ["c"] and not list(a.parent.glob("*.canonical"))


def test_a_graph_without_external_data_is_left_as_it_is(tmp_path):
    path = tmp_path / "model.onnx"
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    onnx.save(model, str(path))
    assert not canonical_external_data(path, onnx.load(str(path)))


def sealed(folder: Path, weights: bytes, own: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.onnx.data").write_bytes(weights)
    (folder / "model.onnx").write_bytes(own)
    write_manifest(folder)
    return folder


def test_equal_large_files_of_two_entries_are_one_file(tmp_path, monkeypatch):
    monkeypatch.setattr(entries, "SHARE_BYTES", 1000)
    weights = os.urandom(4096)
    a = sealed(tmp_path / "cache" / "m_prefill", weights, b"graph a")
    assert share_files(a) == 0  # the first holder of these bytes: its file becomes the shared one
    b = sealed(tmp_path / "cache" / "m_decode", weights, b"graph b")
    assert share_files(b) == 4096
    assert (a / "model.onnx.data").samefile(b / "model.onnx.data")
    assert not (a / "model.onnx").samefile(b / "model.onnx")  # small files stay their own
    assert verify_entry(a) is None and verify_entry(b) is None
    other = sealed(tmp_path / "cache" / "n_decode", os.urandom(4096), b"graph n")
    assert share_files(other) == 0 and not (other / "model.onnx.data").samefile(a / "model.onnx.data")
    pool = tmp_path / "cache" / SHARED
    assert len(list(pool.iterdir())) == 2
    for entry in (a, b):  # entries deleted: their bytes' shared name goes at the next seal
        for f in entry.iterdir():
            f.unlink()
        entry.rmdir()
    share_files(sealed(tmp_path / "cache" / "o", b"x" * 2000, b"o"))
    assert sorted(p.stat().st_size for p in pool.iterdir()) == [2000, 4096]  # n's and o's, not m's


def test_without_hard_links_an_entry_keeps_its_own_files(tmp_path, monkeypatch):
    monkeypatch.setattr(entries, "SHARE_BYTES", 1000)
    weights = os.urandom(4096)
    a = sealed(tmp_path / "a", weights, b"a")
    share_files(a)

    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    b = sealed(tmp_path / "b", weights, b"b")
    assert share_files(b) == 0
    assert not (a / "model.onnx.data").samefile(b / "model.onnx.data") and verify_entry(b) is None
    assert sorted(p.name for p in b.iterdir()) == ["manifest.json", "model.onnx", "model.onnx.data"]


@pytest.mark.slow
def test_a_models_prefill_and_decode_exports_share_their_weights(tmp_path, monkeypatch):
    """Real exports of the tiny llama, its weights put in external data as a large model's are."""
    from tasks.export import onnx as onnx_format
    from tasks.jobs import export_job
    from tests.conftest import plan_jobs

    monkeypatch.setattr(onnx_format, "EXTERNAL_DATA_BYTES", 0)
    monkeypatch.setattr(_weights, "INLINE_BYTES", 64 << 10)
    monkeypatch.setattr(entries, "SHARE_BYTES", 64 << 10)
    plan = plan_jobs(
        ["phase=prefill", f"cluster.export_cache={tmp_path}"], ["phase=decode", f"cluster.export_cache={tmp_path}"]
    )
    results = [export_job(job.spec) for job in plan.exports.values()]
    assert all(r.ok for r in results), [r.failure for r in results]
    prefill, decode = (Path(r.out_dir) / "model.onnx.data" for r in results)
    assert prefill.samefile(decode) and prefill.stat().st_nlink == 3  # two entries and the shared name


def test_a_node_receiving_a_models_entries_keeps_its_weights_once(tmp_path, monkeypatch):
    from tasks.worker.transfer import localise, pack

    monkeypatch.setattr(entries, "SHARE_BYTES", 1000)
    weights = os.urandom(4096)
    made = [sealed(tmp_path / "made" / name, weights, name.encode()) for name in ("m_prefill", "m_decode")]
    there = [tmp_path / "node" / entry.name for entry in made]
    for entry, dest in zip(made, there, strict=True):
        assert localise(dest, pack(entry)) == "fetched"
    assert (there[0] / "model.onnx.data").samefile(there[1] / "model.onnx.data")
    assert all(verify_entry(dest) is None for dest in there)
