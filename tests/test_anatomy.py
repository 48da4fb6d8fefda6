"""What is inside an artifact (tasks/export/_anatomy.py, tasks/measure/anatomy.py) and what a file says about itself
(tasks/export/_description.py): counts on graphs small enough to check by hand, a module swap seen
as a difference, and the description read back from .onnx and .pte with the runtimes alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.export import executorch as executorch_format
from tasks.export import onnx as onnx_format
from tasks.export._description import CACHE_LAYOUT
from tasks.measure import anatomy


def hand_onnx(path, extra_transpose: bool = False):
    """x[2,8,4] -> Transpose -> MatMul(W[8,4] float32: 128 bytes) -> Cast -> If(Identity |
    Identity) -> Identity -> FusedMatMul (domain com.microsoft); a Constant of 3 int64 (24
    bytes). Not meant to run: only to be counted."""
    import onnx
    from onnx import TensorProto, helper

    def branch(name):
        return helper.make_graph(
            [helper.make_node("Identity", ["c"], [f"{name}_out"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT16, None)],
        )

    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1])]
    if extra_transpose:  # a swap that adds a transpose pair (the data ends where it was)
        nodes += [
            helper.make_node("Transpose", ["xt"], ["xtt"], perm=[0, 2, 1]),
            helper.make_node("Transpose", ["xtt"], ["xt2"], perm=[0, 2, 1]),
        ]
    last = "xt2" if extra_transpose else "xt"
    nodes += [
        helper.make_node("MatMul", [last, "W"], ["m"]),
        helper.make_node("Cast", ["m"], ["c"], to=TensorProto.FLOAT16),
        helper.make_node("Constant", [], ["flag"], value=helper.make_tensor("k", TensorProto.INT64, [3], [1, 0, 0])),
        helper.make_node("If", ["flag"], ["chosen"], then_branch=branch("then"), else_branch=branch("else")),
        helper.make_node("Identity", ["chosen"], ["y0"]),
        helper.make_node("FusedMatMul", ["y0", "y0"], ["y"], domain="com.microsoft"),
    ]
    w = helper.make_tensor("W", TensorProto.FLOAT, [8, 4], np.ones(32, np.float32).tobytes(), raw=True)
    graph = helper.make_graph(
        nodes,
        "hand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        initializer=[w],
    )
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_an_onnx_graph_counted_by_hand(tmp_path):
    a = onnx_format.anatomy(hand_onnx(tmp_path / "m.onnx"))
    assert a["ops"] == {
        "Cast": 1,
        "Constant": 1,
        "Identity": 3,  # one in each branch of If, one after it
        "If": 1,
        "MatMul": 1,
        "Transpose": 1,
        "com.microsoft.FusedMatMul": 1,
    }
    assert (a["nodes"], a["transposes"], a["copies"], a["casts"]) == (9, 1, 3, 1)
    assert a["constant_bytes"] == 128 + 24
    assert a["artifact_bytes"] == (tmp_path / "m.onnx").stat().st_size
    assert a["partitions"] == [] and a["outside_delegates"] == {}
    assert anatomy.headline(a) == {
        "anatomy_nodes": 9.0,
        "anatomy_transposes": 1.0,
        "anatomy_copies": 3.0,
        "anatomy_casts": 1.0,
        "anatomy_constant_bytes": 152.0,
        "anatomy_partitions": 0.0,
        "anatomy_ops_outside_delegates": 0.0,
    }
    assert anatomy.rows(a)[:2] == [{"op": "Identity", "count": 3}, {"op": "Cast", "count": 1}]


def test_a_swap_that_adds_transposes_shows_up_as_a_difference(tmp_path):
    before = onnx_format.anatomy(hand_onnx(tmp_path / "a.onnx"))
    after = onnx_format.anatomy(hand_onnx(tmp_path / "b.onnx", extra_transpose=True))
    assert anatomy.changes(before, after) == ["+2 ops", "+2 transposes", "Transpose +2"]
    assert anatomy.changes(before, before) == []
    assert anatomy.changes(after, before) == ["-2 ops", "-2 transposes", "Transpose -2"]


class PermuteAddCast:
    """x[2,8,4] -> permute -> + b[4,8] (float32: 128 bytes) -> float16: three ops by hand."""

    @staticmethod
    def edge(delegate: bool):
        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.b = torch.nn.Parameter(torch.randn(4, 8))

            def forward(self, x):
                return (x.permute(0, 2, 1) + self.b).to(torch.float16)

        program = torch.export.export(M(), (torch.randn(2, 8, 4),))
        parts = [XnnpackPartitioner()] if delegate else []
        return to_edge_transform_and_lower(program, partitioner=parts).exported_program()


@pytest.mark.slow
def test_an_executorch_graph_counted_by_hand():
    ops = {"aten.add": 1, "aten.permute_copy": 1, "dim_order_ops._to_dim_order_copy": 1}
    portable = executorch_format.anatomy(PermuteAddCast.edge(delegate=False))
    assert portable["ops"] == portable["outside_delegates"] == ops and portable["partitions"] == []
    assert (portable["nodes"], portable["transposes"], portable["copies"], portable["casts"]) == (3, 1, 0, 1)
    assert portable["constant_bytes"] == 128
    xnnpack = executorch_format.anatomy(PermuteAddCast.edge(delegate=True))
    assert xnnpack["ops"] == ops and xnnpack["constant_bytes"] == 128  # the weight moved into the delegate
    assert xnnpack["partitions"] == [{"backend": "XnnpackBackend", "ops": {"aten.add": 1, "aten.permute_copy": 1}}]
    assert xnnpack["outside_delegates"] == {"dim_order_ops._to_dim_order_copy": 1}
    assert anatomy.rows(xnnpack)[0] == {"op": "aten.add", "count": 1, "delegated": 1, "portable": 0}
    assert anatomy.changes(portable, xnnpack) == [
        "+1 delegate partitions",
        "aten.add now delegated",
        "aten.permute_copy now delegated",
    ]


def check_description(d: dict, result, fmt: str) -> None:
    assert d["name"] == "llama-tiny_decode" and d["export_format"] == fmt and d["export_key"] == result.key
    assert d["phasesweep_version"] and d["dtype"] == "float32" and d["model"]["family"] == "llama"
    assert {n: v["shape"] for n, v in d["inputs"].items()} == result.input_shapes
    assert list(d["outputs"])[0] == "logits" and d["outputs"]["logits"]["dtype"] == "float32"
    past = result.input_shapes["past_key_values.0.key"]  # [batch, kv_heads, seq, head_dim]
    assert d["kv_cache"] == {"layout": CACHE_LAYOUT, "implementation": "static", "capacity": past[2], "in_graph": False}
    assert d["phase"]["name"] == "decode" and d["phase"]["batch"] == past[0]


@pytest.mark.slow
def test_an_onnx_file_says_what_it_is(exported):
    import onnxruntime as ort

    result = exported("llama", "decode", "onnx")
    session = ort.InferenceSession(result.artifact, providers=["CPUExecutionProvider"])
    check_description(onnx_format.read_metadata(session.get_modelmeta().custom_metadata_map), result, "onnx")
    assert result.anatomy["nodes"] == result.details["onnx_nodes"]


@pytest.mark.slow
def test_a_pte_file_says_what_it_is(exported):
    from executorch.runtime import Runtime

    result = exported("llama", "decode", "executorch")
    program = Runtime.get().load_program(result.artifact)

    def get(name):
        (value,) = program.load_method(name).execute([])
        return value

    check_description(json.loads(get(executorch_format.METHOD)), result, "executorch")
    past = result.input_shapes["past_key_values.0.key"]
    assert (get("get_max_seq_len"), get("get_max_batch_size"), get("get_n_layers")) == (past[2], past[0], 2)
    assert get("use_kv_cache") is True and get("enable_dynamic_shape") is False
    assert len(result.anatomy["partitions"]) == result.details["delegated_subgraphs"] > 0


FUSE = ["fuse_cascaded_permutes", "fuse_permute_pairs", "postpone_permutes"]


def test_a_list_axis_reads_as_its_items_in_a_variant_name():
    from orchestrator.plan.naming import suffix

    assert suffix("backend.export_options.passes", json.dumps(FUSE)) == "passes-" + "+".join(FUSE)
    assert suffix("backend.export_options.passes", "[]") == "passes-none"


@pytest.mark.slow
def test_executorchs_permute_passes_are_an_axis_that_shows_in_anatomy_and_keeps_parity(exported, planned_variant):
    import dataclasses

    from tasks.jobs import bench_job
    from tests.conftest import FAST_BENCH

    plain = exported("llama", "decode", "executorch")
    fused, bench = planned_variant(
        "model=llama", "phase=decode", "backend=executorch", f"backend.export_options.passes={FUSE}"
    )
    assert fused.key != plain.key and fused.details["passes"] == ",".join(FUSE)
    # grouped-query attention no longer repeats kv heads (tasks/model/sdpa.py), so the tiny
    # decode graph may have no permute pair left to fuse: never more transposes, and any change named
    assert fused.anatomy["transposes"] <= plain.anatomy["transposes"]
    if fused.anatomy["transposes"] < plain.anatomy["transposes"]:
        words = anatomy.changes(plain.anatomy, fused.anatomy)
        assert f"{fused.anatomy['transposes'] - plain.anatomy['transposes']:+d} transposes" in words
    result = bench_job(dataclasses.replace(bench, bench=FAST_BENCH))
    assert result.ok and result.parity["passed"], result.failure


@pytest.mark.slow
def test_onnxruntimes_optimiser_level_is_an_axis_whose_graph_is_counted(planned_variant):
    """ONNX Runtime writes the graph its optimiser made; its counts are the session's metrics."""
    from tasks.export.onnx import FUSED
    from tasks.runtimes import runtime_module
    from tasks.worker.entries import load_export

    counts = {}
    for level in ("disable", "all"):
        result, bench = planned_variant(
            "model=llama", "phase=decode", "backend=onnxruntime", f"backend.options.graph_optimization_level={level}"
        )
        meta, feeds, _ = load_export(result.out_dir)
        session = runtime_module("onnxruntime").load(bench, meta, feeds)
        counts[level] = session.metrics
        assert len(session.run(feeds)) == len(meta["output_names"])
    assert counts["disable"]["ort_graph_nodes"] == result.anatomy["nodes"]  # nothing fused: the file as exported
    assert counts["all"]["ort_graph_nodes"] < counts["disable"]["ort_graph_nodes"]
    fused = {f"ort_graph_{op}" for op in FUSED}  # the fused ops' counts (tests/test_genai.py reads them)
    assert set(counts["all"]) == {"ort_graph_nodes", "ort_graph_transposes", "ort_graph_copies", "ort_graph_casts"} | fused
