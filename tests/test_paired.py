"""Interleaved re-measurement (tasks/paired.py) and its verdict (orchestrator/read/stats.py
compare_paired): the statistics on given rounds, and two real sides of the test-only `spin`
backend (tests/spin_backend/: eager plus a busy-wait of spin_us per timed call)."""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from orchestrator.read.stats import compare_paired
from tasks.paired import PairOptions, PairSpec, decided, paired_job, ratio_interval
from tests.conftest import FAST_BENCH

SPIN = Path(__file__).resolve().parent / "spin_backend"


def pair(ratios: list[float]) -> dict:
    med, ci = ratio_interval(ratios)
    blocks = {"baseline": [1e6] * len(ratios), "candidate": [r * 1e6 for r in ratios]}
    return {"ratios": ratios, "ratio": med, "ci": ci, "block_ns": blocks, "samples_ns": {"baseline": [1], "candidate": [1]}}


def test_the_interval_is_the_median_s_order_statistics():
    ratios = [1.0 + i / 100 for i in range(20)]  # 1.00 .. 1.19
    med, (low, high) = ratio_interval(ratios)
    assert med == pytest.approx(1.095)
    assert low < med < high and low in ratios and high in ratios
    assert ratio_interval([1.1] * 5)[1] is None  # fewer than 6 rounds: no 95% interval


def test_paired_rounds_decide_the_verdict():
    slower = compare_paired(pair([1.10 + (i % 3) / 100 for i in range(20)]))
    assert slower["verdict"] == "slower" and slower["p_value"] < 1e-4 and slower["rounds"] == 20
    same = compare_paired(pair([1.0 + ((-1) ** i) * (i % 4) / 400 for i in range(20)]))
    assert same["verdict"] == "same" and same["measured"] == "interleaved, 20 rounds"
    mixed = compare_paired(pair([0.8, 1.3] * 10))  # as often above as below 1, widely spread
    assert mixed["verdict"] == "inconclusive"


def test_rounds_stop_once_the_interval_decides_the_verdict():
    assert decided((1.06, 1.20), 0.05) and decided((0.80, 0.94), 0.05)  # slower, faster
    assert decided((0.97, 1.04), 0.05)  # same
    assert not decided((1.03, 1.20), 0.05) and not decided((0.94, 1.02), 0.05)  # astride a bound
    # the verdict agrees with the stop: a decided interval is never inconclusive when the rounds agree
    for ratios in ([1.10 + (i % 3) / 100 for i in range(20)], [1.0 + ((-1) ** i) * (i % 4) / 400 for i in range(20)]):
        p = pair(ratios)
        assert decided(p["ci"], 0.05) and compare_paired(p)["verdict"] != "inconclusive"


@pytest.fixture(scope="module")
def spin_sides(tmp_path_factory):
    """(baseline, candidate) BenchSpecs of the spin backend on one tiny decode export; the
    spawned sides import spin_runtime by name, so its folder is on PYTHONPATH."""
    from tasks.jobs import export_job
    from tasks.specs import BenchSpec, ExportSpec, PhaseSpec
    from tests.conftest import model_spec

    phase = PhaseSpec("decode", batch=1, context_len=16, parity_steps=1)
    model = model_spec("llama")
    out = tmp_path_factory.mktemp("paired") / "entry"
    export = export_job(ExportSpec("paired", model, phase, "none", str(out)))
    assert export.ok, export.failure and export.failure.traceback
    bench = replace(FAST_BENCH, warmup_max_seconds=0.3)
    spec = BenchSpec("llama_decode_spin_cpu", "spin_runtime", "cpu", model, phase, str(out), bench)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(SPIN), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
        mp.syspath_prepend(str(SPIN))
        yield spec


def spun(spec, spin_us: int, **options):
    return replace(spec, runtime_options={"spin_us": spin_us, **options})


@pytest.mark.slow
def test_a_known_slowdown_is_found_and_no_change_is_not(spin_sides):
    """Candidate spins 20 ms more than the baseline's 20 ms (plus the tiny model's own call,
    a few ms, stretched several times on a busy machine): the paired ratio lies well above 1;
    two identical sides never read as slower."""
    opts = PairOptions(max_seconds=10, min_rounds=12)
    slower = paired_job(PairSpec("x", spun(spin_sides, 20_000), spun(spin_sides, 40_000), opts))
    assert slower.ok, slower.failure
    assert compare_paired(asdict(slower))["verdict"] == "slower"
    assert slower.ci[0] > 1.1 and slower.stop in ("target", "decided", "time", "rounds")
    assert len(slower.block_ns["baseline"]) == len(slower.ratios) == len(slower.block_ns["candidate"])
    same = paired_job(PairSpec("x", spun(spin_sides, 20_000), spun(spin_sides, 20_000), opts))
    assert same.ok, same.failure
    assert compare_paired(asdict(same))["verdict"] in ("same", "inconclusive")


@pytest.mark.slow
def test_a_side_that_fails_to_load_is_named(spin_sides):
    result = paired_job(PairSpec("x", spun(spin_sides, 0), spun(spin_sides, 0, fault="raise"), PairOptions(max_seconds=2)))
    assert not result.ok
    assert "candidate side failed" in result.failure.error and "injected fault" in result.failure.error
