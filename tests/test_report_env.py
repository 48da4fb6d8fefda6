"""Environment fingerprint, decode bandwidth, summary table and sweep comparison."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orchestrator.compare import compare_rows, compare_sweeps
from orchestrator.report import Outcome, shapes_text, status_text, summary_rows, table
from tasks.environment import fingerprint, peak_bandwidth_gbs
from tasks.jobs import _decode_bandwidth
from tasks.specs import BenchSpec, PhaseSpec
from tests.conftest import model_spec


def test_fingerprint_names_the_machine_and_libraries():
    env = fingerprint("cpu")
    assert env["cpu_count"] == str(os.cpu_count()) and env["cpu_model"]
    assert env["version.torch"].startswith("2.") and "version.onnxruntime" in env
    assert "gpu_name" not in env


def test_peak_bandwidth_lookup_prefers_the_specific_name():
    assert peak_bandwidth_gbs("NVIDIA H100 PCIe") == 2000.0
    assert peak_bandwidth_gbs("NVIDIA H100 80GB HBM3") == 3350.0
    assert peak_bandwidth_gbs("NVIDIA H200") == 4800.0
    assert peak_bandwidth_gbs("Some Future GPU") is None


def test_decode_bandwidth_counts_weights_and_cache():
    feeds = {
        "input_ids": np.zeros((1, 1), np.int64),
        "past_key_values.0.key": np.zeros((1, 2, 100, 16), np.float32),
        "past_key_values.0.value": np.zeros((1, 2, 100, 16), np.float32),
    }
    meta = {"details": {"parameters": 1_000_000}}
    spec = BenchSpec("v", "onnxruntime", "cuda", model_spec("llama"), PhaseSpec("decode", 1, context_len=92), "", "")
    out = _decode_bandwidth(spec, meta, feeds, median_ms=1.0, env={"gpu_name": "NVIDIA H200"})
    assert out["decode_bytes_per_step"] == 4_000_000 + 2 * 100 * 2 * 16 * 4
    assert out["achieved_bandwidth_gbs"] == pytest.approx(out["decode_bytes_per_step"] / 1e-3 / 1e9)
    assert out["bandwidth_fraction_of_peak"] == pytest.approx(out["achieved_bandwidth_gbs"] / 4800.0)
    cpu = _decode_bandwidth(BenchSpec("v", "onnxruntime", "cpu", spec.model, spec.phase, "", ""), meta, feeds, 1.0, {})
    assert "bandwidth_fraction_of_peak" not in cpu


def test_summary_rows_show_shapes_parity_and_status():
    ok = Outcome(
        "llama_decode_onnxruntime_cpu",
        status="ok",
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
            "latency_cv": 0.3,
        },
    )
    bad = Outcome("phi3_decode_executorch_cpu", status="failed", stage="parity", error="logits differ")
    rows = summary_rows([ok, bad])
    assert rows[0]["inputs"] == "input_ids[1,1] pos[1] kv 2x[1,2,136,16]"
    assert rows[0]["parity_max_diff"] == "3.0e-06 (8 steps)" and rows[0]["status"] == "ok, unstable (cv 30%)"
    assert rows[1]["status"] == "FAILED parity: logits differ" and rows[1]["median_ms"] == "-"
    text = table(rows)
    assert text.splitlines()[0].startswith("variant") and "FAILED parity" in text
    assert shapes_text({"input_ids": [2, 16]}) == "input_ids[2,16]"
    assert status_text(Outcome("x", status="skipped", error="why")) == "skipped: why"


def test_compare_rows_show_each_variant_and_the_ones_only_one_sweep_has():
    rng = np.random.default_rng(0)
    base = {"v1": rng.lognormal(0, 0.05, 500) * 1e6, "only_a": [1_000_000] * 10}
    cand = {"v1": rng.lognormal(0, 0.05, 500) * 1.5e6, "only_b": [1_000_000] * 10}
    rows = {r["variant"]: r for r in compare_rows(compare_sweeps(base, cand))}
    assert set(rows) == {"v1", "only_a", "only_b"}
    assert rows["v1"]["verdict"] == "slower" and rows["v1"]["ratio"].startswith("1.")
    assert rows["only_a"]["verdict"] == "only in baseline" and rows["only_b"]["verdict"] == "only in candidate"
    text = table(list(rows.values()))
    assert text.splitlines()[0].split() == ["variant", "baseline_ms", "candidate_ms", "ratio", "ratio_95ci", "p_holm", "verdict"]
