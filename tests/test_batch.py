"""A phase.batch sweep: aggregate and per-sequence tokens/s per batch, the knee (the batch at
which aggregate throughput stops growing, orchestrator/read/curves.py KNEE_RULE), its plot."""

from __future__ import annotations

import pytest

from orchestrator.common.outcome import Outcome, Status
from orchestrator.read.curve_plots import batch_lines, batch_plot
from orchestrator.read.curves import KNEE_GAIN, batch_rows, curves_text, knee
from orchestrator.read.plots import plot_rows
from tests.conftest import plan_jobs


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([(1, 100.0), (2, 190.0), (4, 200.0), (8, 400.0)], (2, True)),  # 4 adds 5%: it stopped at 2
        ([(1, 100.0), (2, 100.0 * (1 + KNEE_GAIN))], (2, False)),  # exactly 10% more: still growing
        ([(1, 100.0), (2, 90.0)], (1, True)),  # a larger batch that is slower
        ([(1, 100.0), (2, 180.0), (4, 330.0), (8, 600.0)], (8, False)),
    ],
)
def test_the_knee_is_the_last_batch_before_one_that_adds_under_ten_percent(points, expected):
    assert knee(points) == expected


def sweep(backend: str, tokens: dict[int, float | None]) -> list[Outcome]:
    out = []
    for b, tps in tokens.items():
        axes = {"model": "llama", "phase": "decode", "backend": backend, "device": "cpu"}
        o = Outcome(f"llama_decode_{backend}_cpu_b{b}", Status.OK if tps else Status.SKIPPED, axes=axes)
        if tps:
            o.metrics = {"latency_ms_median": 1e3 * b / tps, "tokens_per_s": tps}
        out.append(o)
    return out


def params_of(outcomes: list[Outcome]) -> dict[str, dict[str, str]]:
    return {o.name: {"phase.batch": o.name.rsplit("_b", 1)[1]} for o in outcomes}


def test_each_backend_sweep_is_one_row_with_its_knee_and_skips_shown():
    ort = sweep("onnxruntime", {1: 1000.0, 2: 1900.0, 4: 2000.0, 8: 2050.0})
    et = sweep("executorch", {1: 800.0, 2: 1600.0, 4: None, 8: None})
    outcomes = ort + et
    rows = batch_rows(outcomes, params_of(outcomes))
    assert [r["variants"] for r in rows] == ["llama_decode_executorch_cpu", "llama_decode_onnxruntime_cpu"]
    assert rows[1]["b4"] == "2,000 (500/seq)" and rows[1]["knee"] == "b2"
    assert rows[0]["b4"] == "skipped" and rows[0]["knee"] == "none (still growing at b2)"
    assert "knee: the last batch before the first one adding under 10%" in curves_text(outcomes, params_of(outcomes))


def test_the_plot_draws_aggregate_throughput_per_backend(tmp_path):
    outcomes = sweep("onnxruntime", {1: 1000.0, 2: 1900.0, 4: 2000.0}) + sweep("eager", {1: 500.0, 2: 900.0, 4: 1700.0})
    rows = plot_rows(outcomes, params_of(outcomes))
    lines = batch_lines([r for r in rows if r["status"] == "ok"])
    assert set(lines["llama"]) == {"decode onnxruntime cpu", "decode eager cpu"}
    path = tmp_path / "batch.png"
    assert batch_plot([r for r in rows if r["status"] == "ok"], path) and path.read_bytes().startswith(b"\x89PNG")


def test_a_batch_sweep_is_planned_on_every_default_backend():
    plan = plan_jobs(*[["phase=decode", f"backend={b}", f"phase.batch={n}"] for b in ("eager", "onnxruntime", "executorch") for n in (1, 8)])
    assert not plan.skipped and len(plan.variants) == 6
    assert {pv.bench.phase.batch for pv in plan.variants} == {1, 8}
