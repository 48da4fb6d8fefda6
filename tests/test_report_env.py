"""Environment fingerprint, decode bandwidth, summary table and sweep comparison."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orchestrator.common.console import table
from orchestrator.common.outcome import Outcome, Status
from orchestrator.read.stats import compare_sweeps
from orchestrator.read.summary import plan_text, shapes_text, status_text, summary_rows
from orchestrator.read.verdict_table import compare_rows
from tasks.measure.environment import fingerprint, peak_bandwidth_gbs
from tasks.phases import decode, phase_module


def test_fingerprint_names_the_machine_and_libraries():
    env = fingerprint("cpu", ("onnx", "onnxruntime"))
    assert env["cpu_count"] == str(os.cpu_count()) and env["cpu_model"]
    assert env["version.onnxruntime"] and env["version.onnx"]
    assert env["version.numpy"]  # always recorded, whatever the backend
    assert "version.torch" not in env  # ONNX Runtime's measurement does not depend on torch
    assert "gpu_name" not in env
    assert fingerprint("cpu", ("torch", "transformers"))["version.torch"].startswith("2.")
    assert "version.onnxruntime" not in fingerprint("cpu", ("executorch",))  # only the libraries asked for
    assert "version.no-such-dist" not in fingerprint("cpu", ("no-such-dist",))


def test_peak_bandwidth_lookup_prefers_the_specific_name():
    assert peak_bandwidth_gbs("NVIDIA H100 PCIe") == 2000.0
    assert peak_bandwidth_gbs("NVIDIA H100 80GB HBM3") == 3350.0
    assert peak_bandwidth_gbs("NVIDIA H200") == 4800.0
    assert peak_bandwidth_gbs("Some Future GPU") is None


def test_decode_bandwidth_counts_weights_rows_read_and_cache_traffic():
    feeds = {
        "input_ids": np.zeros((2, 1), np.int64),
        "cache_position": np.zeros((1,), np.int64),
        "past_key_values.0.key": np.zeros((2, 2, 100, 16), np.float32),
        "past_key_values.0.value": np.zeros((2, 2, 100, 16), np.float32),
    }
    cache = 2 * (2 * 2 * 100 * 16 * 4)  # key + value bytes
    tied = {"parameters": 1_000_000, "embedding_parameters": 32_000, "hidden_size": 64, "tied_embeddings": 1}
    args = {"model_dtype": "float32", "details": tied, "feeds": feeds, "median_ms": 1.0}
    out = decode.extra_metrics(**args, peak_gbs=4800.0)
    # tied: the head reads the whole table, so every parameter once; the cache read by
    # attention, then read and written again by the out-of-place update
    assert out["decode_weight_bytes_per_step"] == 4_000_000
    assert out["decode_cache_bytes_per_step"] == 3 * cache
    assert out["decode_bytes_per_step"] == 4_000_000 + 3 * cache
    assert out["achieved_bandwidth_gbs"] == pytest.approx(out["decode_bytes_per_step"] / 1e-3 / 1e9)
    assert out["bandwidth_fraction_of_peak"] == pytest.approx(out["achieved_bandwidth_gbs"] / 4800.0)
    untied = decode.extra_metrics(**{**args, "details": {**tied, "tied_embeddings": 0}}, peak_gbs=None)
    # untied: of the 32,000-parameter input table a step reads only its 2 rows of 64
    assert untied["decode_weight_bytes_per_step"] == (1_000_000 - 32_000 + 2 * 64) * 4
    assert "bandwidth_fraction_of_peak" not in untied and "peak_bandwidth_gbs" not in untied
    half = decode.extra_metrics(**{**args, "model_dtype": "bfloat16"}, peak_gbs=None)
    assert half["decode_weight_bytes_per_step"] == 2_000_000  # weights at 2 bytes each
    assert phase_module("prefill").extra_metrics(**args, peak_gbs=4800.0) == {}


def test_summary_rows_show_shapes_parity_and_status():
    ok = Outcome(
        "llama_decode_onnxruntime_cpu",
        status=Status.OK,
        unstable=True,
        shapes={
            "input_ids": [1, 1],
            "cache_position": [1],
            "past_key_values.0.key": [1, 2, 136, 16],
            "past_key_values.0.value": [1, 2, 136, 16],
        },
        metrics={
            "latency_ms_median": 0.25,
            "latency_ms_p90": 0.3,
            "tokens_per_s": 4000.0,
            "parity_max_abs_diff": 3e-6,
            "parity_steps": 8,
            "latency_iqr_rel": 0.3,
        },
    )
    bad = Outcome("phi3_decode_executorch_cpu", status=Status.FAILED, stage="parity", error="logits differ")
    rows = summary_rows([ok, bad])
    assert rows[0]["inputs"] == "input_ids[1,1] pos[1] kv 2x[1,2,136,16]"
    assert rows[0]["parity_max_diff"] == "3.0e-06 (8 steps)" and rows[0]["status"] == "ok, unstable (iqr 30%)"
    assert rows[1]["status"] == "FAILED parity: logits differ" and rows[1]["median_ms"] == "-"
    text = table(rows)
    assert text.splitlines()[0].startswith("variant") and "FAILED parity" in text
    assert shapes_text({"input_ids": [2, 16]}) == "input_ids[2,16]"
    assert status_text(Outcome("x", status=Status.SKIPPED, error="why")) == "skipped: why"
    assert (
        status_text(Outcome("x", status=Status.ABORTED, error="KeyboardInterrupt: ")) == "aborted: KeyboardInterrupt:"
    )
    assert status_text(Outcome("x", status=Status.OK, metrics={"latency_iqr_rel": 0.02})) == "ok"
    assert status_text(Outcome("x")) == "planned"


def test_compare_rows_show_each_variant_and_the_ones_only_one_sweep_has():
    rng = np.random.default_rng(0)
    base = {"v1": rng.lognormal(0, 0.05, 500) * 1e6, "only_a": [1_000_000] * 10}
    cand = {"v1": rng.lognormal(0, 0.05, 500) * 1.5e6, "only_b": [1_000_000] * 10}
    rows = {r["variant"]: r for r in compare_rows(compare_sweeps(base, cand))}
    assert set(rows) == {"v1", "only_a", "only_b"}
    assert rows["v1"]["verdict"] == "slower" and rows["v1"]["ratio"].startswith("1.")
    assert rows["only_a"]["verdict"] == "only in baseline" and rows["only_b"]["verdict"] == "only in candidate"
    text = table(list(rows.values()))
    assert text.splitlines()[0].split() == [
        "variant",
        "baseline_ms",
        "candidate_ms",
        "ratio",
        "ratio_95ci",
        "p_holm",
        "verdict",
    ]


def test_plan_text_shows_resources_notes_exports_and_skipped():
    """The dry run's view: each benchmark's resources and pool, why one cannot run, the
    export jobs with the variants they serve, the skipped combinations."""
    from orchestrator.plan.placement import Capacity
    from tests.test_plan import plan_of

    plan = plan_of(
        Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=0, memory=8 * 2**30),
        backend="onnxruntime,executorch",
        device="cpu,cuda",
    )
    text = plan_text(plan)
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    cpu = lines["llama_prefill_onnxruntime_cpu"]
    assert "cpu=2 " in cpu and "mem=" in cpu and "phasesweep_bench=1 [bench_cpu]" in cpu
    cuda = lines["llama_prefill_onnxruntime_cuda"]
    assert "gpu=1" in cuda and "[gpu]" in cuda and "no node of this Ray cluster has one" in cuda
    assert "llama_prefill_executorch_cuda (job #3)" in text and "does not run on device=cuda" in text
    exports = [line for line in text.splitlines() if line.split()[1:2] in (["onnx"], ["executorch"])]
    assert len(exports) == 2 and all("[cpu]" in line for line in exports)
