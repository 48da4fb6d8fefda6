"""True bytes of quantised artifacts: ONNX Runtime's MatMulNBits files counted as stored
(packed weights and scales), tables read by row apart, a .pte's segments from its header,
and decode's bandwidth from the bytes a step reads. Small graphs made in memory."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.export import _onnx_quant, _pte_bytes
from tasks.export import onnx as onnx_format
from tasks.measure import anatomy as anatomy_record
from tasks.phases import decode

K, N, ROWS = 128, 256, 64  # a MatMul weight [K, N] and an embedding table [ROWS, K]


def embed_and_project() -> onnx.ModelProto:
    """ids -> Gather(table) -> MatMul(weight): an embedding lookup and one projection, float32."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((ROWS, K)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["x"], name="embed"), helper.make_node("MatMul", ["x", "weight"], ["y"], name="proj")],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, N])],
        [table, weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def anatomy_of(proto: onnx.ModelProto, tmp_path) -> dict:
    path = tmp_path / "model.onnx"
    onnx.save(proto, str(path))
    return onnx_format.anatomy(path)


def test_a_float_graph_counts_every_constant_and_its_lookup_table_apart(tmp_path):
    a = anatomy_of(embed_and_project(), tmp_path)
    assert a["constant_bytes"] == (ROWS * K + K * N) * 4
    assert a["lookup_tables"] == [{"bytes": ROWS * K * 4, "rows": ROWS}]
    # a step of batch 2 reads the projection whole and two rows of the table
    assert anatomy_record.bytes_read_per_step(a, 2) == K * N * 4 + 2 * K * 4


@pytest.mark.parametrize(
    "quant,bits,block,level",
    [("int4", 4, 32, None), ("8da4w", 4, 32, 4), ("int8", 8, K, None)],  # int8: one block of K when K <= 256
)
def test_matmulnbits_weights_count_as_their_packed_bytes_and_scales(tmp_path, quant, bits, block, level):
    import onnxruntime as ort

    proto = embed_and_project()
    ids = np.array([[3], [7]], np.int64)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    details = _onnx_quant.quantize(proto, quant, 32)
    (node,) = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["bits"], attrs["block_size"], attrs.get("accuracy_level")) == (bits, block, level)
    assert len(node.input) == 3  # symmetric: weights and scales, no zero points
    assert details["onnx_quant_matmuls"] == 1 and details["onnx_float_matmuls"] == 0
    a = anatomy_of(proto, tmp_path)
    packed = K * N * bits // 8
    scales = N * (K // block) * 4  # one float32 scale per block
    assert a["constant_bytes"] == ROWS * K * 4 + packed + scales  # the table stays float
    assert a["ops"]["com.microsoft.MatMulNBits"] == 1 and "MatMul" not in a["ops"]
    assert anatomy_record.bytes_read_per_step(a, 2) == packed + scales + 2 * K * 4
    if quant == "int4":  # the quantised matrix: an eighth of float32, plus a scale per 32 weights
        assert (packed + scales) / (K * N * 4) == pytest.approx(1 / 8 + 1 / 32)
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert np.abs(got - want).max() < 0.25 * np.abs(want).max()  # quantised, not broken


def test_int8_blocks_are_the_largest_mlas_quantises_and_no_smaller_than_k():
    assert [_onnx_quant.block_size("int8", 32, k) for k in (64, 128, 960, 2048)] == [64, 128, 256, 256]
    assert _onnx_quant.block_size("int8", 32, 8) == _onnx_quant.MIN_BLOCK
    assert _onnx_quant.block_size("int4", 64, 2048) == _onnx_quant.block_size("8da4w", 64, 960) == 64


def test_the_genai_builder_gets_its_own_precision_for_each_quant():
    assert _onnx_quant.genai_options("int4", 32)[:2] == ("int4", ["accuracy_level=1", "block_size=32", "is_symmetric=true"])
    assert _onnx_quant.genai_options("8da4w", 64)[:2] == ("int4", ["accuracy_level=4", "block_size=64", "is_symmetric=true"])
    assert _onnx_quant.genai_options("int8", 32)[0] == "int8"


def test_a_4bit_tensor_without_raw_bytes_counts_two_to_a_byte():
    t = helper.make_tensor("w", TensorProto.INT4, [3, 5], np.zeros(15, np.int8).tolist())
    assert not t.raw_data and onnx_format._tensor_bytes(t) == 8


def test_a_table_read_otherwise_than_by_row_is_read_whole(tmp_path):
    proto = embed_and_project()
    proto.graph.node.append(helper.make_node("ReduceSum", ["table"], ["s"], name="sum"))
    assert anatomy_of(proto, tmp_path)["lookup_tables"] == []


def test_a_pte_header_gives_its_segment_bytes(tmp_path):
    def pte(magic: bytes, length: int, segments: int) -> bytes:
        header = magic + length.to_bytes(4, "little") + (1000).to_bytes(8, "little") + (4096).to_bytes(8, "little")
        return b"\0" * 4 + b"ET12" + header + segments.to_bytes(8, "little") + b"\0" * 64

    path = tmp_path / "model.pte"
    path.write_bytes(pte(b"eh00", 32, 123_456))
    assert _pte_bytes.segment_bytes(path) == 123_456
    path.write_bytes(pte(b"eh00", 24, 123_456))  # an older header, without the segment size
    assert _pte_bytes.segment_bytes(path) is None
    path.write_bytes(pte(b"xxxx", 32, 123_456))
    assert _pte_bytes.segment_bytes(path) is None


def test_decode_bandwidth_reads_the_artifacts_bytes_not_the_parameter_count():
    feeds = {"input_ids": np.zeros((2, 1), np.int64), "cache_position": np.zeros((1,), np.int64)}
    details = {"parameters": 1_000_000, "embedding_parameters": 32_000, "hidden_size": 64, "tied_embeddings": 1}
    anatomy = {"constant_bytes": 700_000, "lookup_tables": [{"bytes": 128_000, "rows": 500}]}
    args = {"model_dtype": "float32", "details": details, "feeds": feeds, "median_ms": 1.0, "peak_gbs": None}
    out = decode.extra_metrics(**args, anatomy=anatomy)
    assert out["decode_weight_bytes_per_step"] == 700_000 - 128_000 + 2 * 256
    assert out["achieved_bandwidth_gbs"] == pytest.approx((700_000 - 128_000 + 512) / 1e-3 / 1e9)
    assert decode.extra_metrics(**args)["decode_weight_bytes_per_step"] == 4_000_000  # no artifact: parameters


def test_a_file_past_the_external_limit_is_quantised_with_its_weights_and_saved_outside(tmp_path):
    """quantize_file loads the external weights, quantises, and writes one data file again,
    which the shared-weights layout then lays out by its bytes (tasks/export/_weights.py)."""
    from tasks.export._weights import canonical_external_data

    path = tmp_path / "model.onnx"
    onnx.save(embed_and_project(), str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    details = _onnx_quant.quantize_file(path, "int4", 32, external_bytes=1)
    assert details["onnx_quant_matmuls"] == 1
    proto = onnx.load(str(path), load_external_data=False)
    assert {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"} == {"model.onnx.data"}
    canonical_external_data(path, proto)
    a = onnx_format.anatomy(path)
    assert a["constant_bytes"] == ROWS * K * 4 + K * N // 2 + N * (K // 32) * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_a_tied_head_read_through_a_transpose_gets_its_own_packed_weight(tmp_path):
    """Gather(table) and MatMul(x, Transpose(table)): the head is quantised from its own
    transposed copy, the lookup keeps the float table, and no Transpose is left."""
    import onnxruntime as ort

    table = numpy_helper.from_array(np.random.default_rng(1).standard_normal((ROWS, K)).astype(np.float32), "table")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["x"], name="embed"),
            helper.make_node("Transpose", ["table"], ["table_t"], name="t", perm=[1, 0]),
            helper.make_node("MatMul", ["x", "table_t"], ["y"], name="head"),
        ],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, ROWS])],
        [table],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    ids = np.array([[3], [7]], np.int64)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    details = _onnx_quant.quantize(proto, "int4", 32)
    assert details["onnx_quant_untied"] == 1 and details["onnx_quant_matmuls"] == 1
    assert [n.op_type for n in proto.graph.node] == ["Gather", "MatMulNBits"]
    a = anatomy_of(proto, tmp_path)
    assert a["lookup_tables"] == [{"bytes": ROWS * K * 4, "rows": ROWS}]
    assert a["constant_bytes"] == ROWS * K * 4 + ROWS * K // 2 + ROWS * (K // 32) * 4
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert np.abs(got - want).max() < 0.25 * np.abs(want).max()


def test_a_group_the_quantiser_cannot_block_is_planned_as_skipped():
    from tasks.contract import Point
    from tasks.specs import ModelSpec, PhaseSpec

    def refuses(quant: str, group: int) -> str | None:
        model = ModelSpec("llama", "llama", "tiny", {}, quant=quant, quant_group=group)
        return onnx_format.FORMAT.refuses(Point("onnxruntime", "cpu", model, PhaseSpec("decode", 1)))

    assert "model.quant_group=48" in refuses("int4", 48)
    assert refuses("int4", 128) is None
    assert refuses("int8", 48) is None  # int8's blocks are its own
