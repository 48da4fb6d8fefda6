"""phase.depths: several cache depths measured from one decode export (tasks/depth_series.py),
normalised and checked as the driver does, planned as one variant (or one per depth where the
contract's fixed_depth says so), recorded as MLflow step metrics, tabled and drawn."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from orchestrator.common.outcome import Outcome, Status
from orchestrator.read.curve_plots import depth_plot
from orchestrator.read.curves import depth_rows
from orchestrator.read.plots import plot_rows
from orchestrator.record.tracking import apply
from tasks.contract import ExportFormat
from tasks.phases import decode, phase_module
from tasks.specs import ConfigError, PhaseSpec
from tests.conftest import DECODE, plan_jobs

DEPTHS = "phase.depths=[8,40]"


def normalized(phase: PhaseSpec, kv_cache: str = "static") -> PhaseSpec:
    module = phase_module(phase.name)
    spec = module.normalize(phase, kv_cache)
    module.check(spec)
    return spec


def test_depths_are_sorted_with_the_context_and_size_a_static_cache():
    p = normalized(replace(DECODE, depths=(64, 8, 64)))
    assert p.depths == (8, 24, 64)  # context_len 24 joins the series
    assert p.cache_len == 64 + decode.HEADROOM and decode.series(p) == (8, 64)
    assert normalized(replace(DECODE, depths=(64,)), "dynamic").cache_len is None
    assert normalized(DECODE).depths is None and decode.series(normalized(DECODE)) == ()


@pytest.mark.parametrize("depths", [(0, 8), ("a",), ()])
def test_bad_depths_are_refused_naming_the_key(depths):
    with pytest.raises(ConfigError, match=r"phase\.depths="):
        normalized(replace(DECODE, depths=depths))


def test_a_cache_len_too_small_for_the_deepest_says_so():
    with pytest.raises(ConfigError, match=r"phase\.cache_len=40 cannot hold phase.depths' deepest=40"):
        normalized(replace(DECODE, depths=(40,), cache_len=40))


def test_other_phases_drop_depths():
    prefill = phase_module("prefill").normalize(PhaseSpec("prefill", 1, prompt_len=8, depths=(8, 16)), "static")
    assert prefill.depths is None


def test_one_variant_and_one_export_measure_every_depth():
    plan = plan_jobs(["phase=decode", DEPTHS])
    (pv,) = plan.variants
    assert pv.name == "llama_decode_onnxruntime_cpu" and len(plan.exports) == 1
    assert pv.bench.phase.depths == (8, 24, 40) and pv.bench.phase.cache_len == 48
    assert pv.variant.params["phase.depths"] is not None


def test_a_backend_that_fixes_the_depth_is_planned_once_per_depth(monkeypatch):
    monkeypatch.setattr(ExportFormat, "fixed_depth", lambda self, point: "its graph holds one depth")
    plan = plan_jobs(["phase=decode", DEPTHS])
    assert [pv.name for pv in plan.variants] == [f"llama_decode_onnxruntime_cpu_ctx{d}" for d in (8, 24, 40)]
    assert len(plan.exports) == 3
    assert all(pv.bench.phase.depths is None for pv in plan.variants)
    assert [pv.bench.phase.cache_len for pv in plan.variants] == [d + decode.HEADROOM for d in (8, 24, 40)]


def test_each_depth_gets_the_data_a_variant_at_that_context_would():
    from tasks.model.models import build_model, model_dims
    from tests.conftest import model_spec

    model = build_model(model_spec("llama"))
    dims = model_dims(model)
    phase = normalized(replace(DECODE, depths=(8, 40)))
    data = decode.make_data(model, phase, "static", dims)
    assert sorted(data.series) == [8, 40] and not data.series[8].series
    alone = decode.make_data(model, replace(phase, context_len=8, depths=None), "static", dims)
    for name, array in alone.feeds.items():
        np.testing.assert_array_equal(data.series[8].feeds[name], array)
    np.testing.assert_array_equal(data.series[8].parity["ref_logits"], alone.parity["ref_logits"])
    assert int(data.series[40].feeds["cache_position"][0]) == 40
    assert data.series[40].feeds["past_key_values.0.key"].shape[2] == phase.cache_len  # one capacity for all


def test_series_are_logged_as_step_metrics():
    class Client:
        def log_batch(self, run_id, metrics, params, tags):
            self.metrics = metrics

    client = Client()
    apply(client, "log", ["run", [("a", 1.0, 5), ("depth_latency_ms_median", 2.0, 5, 512)], [], []])
    assert [(m.key, m.value, m.step) for m in client.metrics] == [("a", 1.0, 0), ("depth_latency_ms_median", 2.0, 512)]


def outcome(name: str, backend: str, points: list[tuple[int, float]]) -> Outcome:
    o = Outcome(name, Status.OK, axes={"model": "llama", "phase": "decode", "backend": backend, "device": "cpu"})
    o.metrics = {"latency_ms_median": points[0][1], "tokens_per_s": 1e3 / points[0][1]}
    o.series = {
        "depth_latency_ms_median": points,
        "depth_latency_ms_median_ci_low": [(d, v * 0.95) for d, v in points],
        "depth_latency_ms_median_ci_high": [(d, v * 1.05) for d, v in points],
        "depth_bandwidth_share": [(d, 0.25) for d, _ in points],
    }
    return o


def test_the_summary_tables_each_series_and_the_plot_draws_where_runtimes_cross(tmp_path):
    a = outcome("llama_decode_onnxruntime_cpu", "onnxruntime", [(128, 0.1), (512, 0.3), (1024, 0.6)])
    b = outcome("llama_decode_executorch_cpu", "executorch", [(128, 0.2), (512, 0.25), (1024, 0.3)])
    plain = Outcome("llama_prefill_eager_cpu", Status.OK, axes=a.axes | {"phase": "prefill"}, metrics={"latency_ms_median": 1.0})
    rows = depth_rows([a, b, plain])
    assert [r["variant"] for r in rows] == [a.name, b.name]
    assert rows[0]["depth 1024"] == "0.600 ms (25% bw)"
    path = tmp_path / "depth.png"
    assert depth_plot(plot_rows([a, b, plain]), path)
    assert path.read_bytes().startswith(b"\x89PNG")
    assert not depth_plot(plot_rows([plain]), tmp_path / "none.png")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnxruntime", "executorch"])
def test_one_export_measures_every_depth_with_parity(planned_variant, backend):
    """Exported once with phase.depths, benchmarked once: a series point per depth, each checked."""
    from tasks.jobs import bench_job

    export, spec = planned_variant("phase=decode", f"backend={backend}", "model.kv_cache=dynamic", DEPTHS)
    assert sorted(p.name for p in Path(export.out_dir).glob("series_*.npz")) == ["series_40.npz", "series_8.npz"]
    result = bench_job(replace(spec, bench=replace(spec.bench, quality=False)))
    assert result.ok, result.failure
    series = result.series
    assert [d for d, _ in series["depth_latency_ms_median"]] == [8, 24, 40]
    assert dict(series["depth_latency_ms_median"])[24] == result.metrics["latency_ms_median"]  # the headline's
    assert all(v < 1e-3 for _, v in series["depth_parity_max_abs_diff"])  # float32: passed its atol
    assert result.metrics["bandwidth_share"] > 0 and len(series["depth_bandwidth_share"]) == 3
