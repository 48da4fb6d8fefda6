"""model.quant on ONNX: the tiny llama's decode exported, quantised by ONNX Runtime's own
tools (MatMulNBits; the genai builder's int4/int8), and run step after step through
phasesweep's session; and a quantised .pte counted by what the file stores."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tasks.export._genai import available
from tasks.jobs import export_job
from tasks.measure.anatomy import bytes_read_per_step
from tasks.runtimes import onnxruntime as ort_runtime
from tasks.specs import BenchSpec, ExportSpec
from tasks.worker.entries import load_export
from tests.conftest import DECODE, FAST_BENCH, model_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def decode_export(tmp_path_factory):
    """`decode_export(quant, exporter="torch")` -> the ExportResult of the tiny llama's decode."""
    made = {}

    def get(quant, exporter="torch"):
        if (quant, exporter) not in made:
            out = tmp_path_factory.mktemp(f"{exporter}-{quant}") / "entry"
            spec = ExportSpec(f"{exporter}-{quant}", model_spec("llama", quant=quant), DECODE, "onnx", str(out), {"exporter": exporter})
            result = export_job(spec)
            assert result.ok, result.failure and result.failure.traceback
            made[quant, exporter] = result
        return made[quant, exporter]

    return get


def steps_through_the_session(result, quant):
    """Every parity step's logits from phasesweep's ONNX Runtime session, each step fed the
    cache the last returned, and the reference's."""
    spec = BenchSpec("q", "onnxruntime", "cpu", model_spec("llama", quant=quant), DECODE, result.out_dir, FAST_BENCH)
    meta, feeds, parity = load_export(result.out_dir)
    session = ort_runtime.RUNTIME.load(spec, meta, feeds)
    logits = session.run_steps(feeds, parity["step_tokens"], int(feeds["cache_position"][0]))
    return np.stack(logits), parity["ref_logits"]


def cosine(a, b):
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("quant,bits,level", [("int4", 4, 0), ("8da4w", 4, 4), ("int8", 8, 0)])
def test_a_quantised_decode_runs_step_after_step_and_reads_its_packed_bytes(decode_export, quant, bits, level):
    base, q = decode_export("none"), decode_export(quant)
    # every MatMul is a projection: attention is GroupQueryAttention (backend.export_options.ort_fusions)
    assert q.anatomy["ops"]["com.microsoft.MatMulNBits"] == base.anatomy["ops"]["MatMul"] == 15
    proto = onnx.load(f"{q.out_dir}/model.onnx", load_external_data=False)
    said = json.loads({p.key: p.value for p in proto.metadata_props}["phasesweep.quant"])
    assert (said["quant"], said["bits"], said["accuracy_level"], said["symmetric"]) == (quant, bits, level, True)
    assert q.details["onnx_quant_matmuls"] == 15 and q.details["onnx_float_matmuls"] == 0
    # every projection [K, N] at its packed bytes plus one float32 scale per block along K
    shapes = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)] * 2 + [(64, 512)]
    block = {"int8": lambda k: k}.get(quant, lambda k: 32)
    packed = sum(k * n * bits // 8 + n * (k // block(k)) * 4 for k, n in shapes)
    floats = sum(k * n * 4 for k, n in shapes)
    assert base.anatomy["constant_bytes"] - q.anatomy["constant_bytes"] == floats - packed
    if quant == "int4":  # an eighth of float32, and a scale per 32 weights
        assert packed / floats == pytest.approx(1 / 8 + 1 / 32)
    assert q.anatomy["lookup_tables"] == base.anatomy["lookup_tables"] == [{"bytes": 512 * 64 * 4, "rows": 512}]
    # the embedding stays float: two rows of it a step (batch 2), every packed projection whole
    assert bytes_read_per_step(q.anatomy, 2) == q.anatomy["constant_bytes"] - 512 * 64 * 4 + 2 * 64 * 4
    got, ref = steps_through_the_session(q, quant)
    assert got.shape == ref.shape and got.shape[0] == DECODE.parity_steps
    # quantised, so not within the float tolerance, but the same function at every step
    assert min(cosine(got[t], ref[t]) for t in range(len(ref))) > (0.999 if bits == 8 else 0.9)


@pytest.mark.skipif(not available(), reason="pip install 'phasesweep[genai]'")
@pytest.mark.parametrize("quant,precision_bits,level", [("int4", 4, 1), ("8da4w", 4, 4), ("int8", 8, 1)])
def test_the_genai_builder_quantises_with_its_own_precision(decode_export, quant, precision_bits, level):
    q = decode_export(quant, "genai")
    proto = onnx.load(f"{q.out_dir}/model.onnx", load_external_data=False)
    nbits = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and not [n for n in proto.graph.node if n.op_type == "MatMul"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nbits[0].attribute}
    assert (attrs["bits"], attrs["accuracy_level"]) == (precision_bits, level)
    assert json.loads({p.key: p.value for p in proto.metadata_props}["phasesweep.quant"])["by"] == "onnxruntime-genai model builder"
    got, ref = steps_through_the_session(q, quant)
    assert min(cosine(got[t], ref[t]) for t in range(len(ref))) > (0.999 if precision_bits == 8 else 0.9)


def test_a_quantised_pte_counts_its_weights_as_xnnpack_stores_them(tmp_path):
    """torchao's 8da4w of two projections lowered to XNNPACK: the .pte stores int4 two to a
    byte with a 2-byte scale per group (the edge program holds them one to a byte)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    from tasks.export import executorch as et_format
    from tasks.export._pte_bytes import segment_bytes

    class Projections(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 128)
            self.up, self.down = torch.nn.Linear(128, 512, bias=False), torch.nn.Linear(512, 256, bias=False)

        def forward(self, ids):
            return self.down(torch.relu(self.up(self.emb(ids))))

    sizes = {}
    for quant in ("none", "8da4w"):
        torch.manual_seed(0)
        model = Projections().eval()
        if quant == "8da4w":
            quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
        program = torch.export.export(model, (torch.zeros(1, 4, dtype=torch.long),))
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        anatomy = et_format.anatomy(edge.exported_program())
        assert anatomy["lookup_tables"] == [{"bytes": 256 * 128 * 4, "rows": 256}]
        path = tmp_path / f"{quant}.pte"
        path.write_bytes(edge.to_executorch().buffer)
        sizes[quant] = (segment_bytes(path), anatomy["constant_bytes"])
    matrices = (128 * 512 + 512 * 256) * 4
    table = 256 * 128 * 4
    assert sizes["none"][0] == pytest.approx(table + matrices, rel=0.01)
    stored = sizes["8da4w"][0] - table  # int4 packed plus a scale per 32 weights
    assert stored == pytest.approx(matrices / 8 + matrices / 4 / 32 * 2, rel=0.05)
    assert sizes["8da4w"][1] - table > 1.4 * stored  # what the edge program's tensors would have said
