"""The measurement loop and its statistics, on a controlled step function."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tasks.bench import measure, summarize, wall_clock
from tasks.specs import BenchOptions


class FakeClock:
    """A timer that returns scripted durations, so the loop's logic is tested exactly."""

    def __init__(self, durations_ns):
        self.durations = iter(durations_ns)
        self.calls = 0

    def __call__(self, step) -> int:
        step()
        self.calls += 1
        return next(self.durations)


def test_first_call_is_reported_apart_and_warmup_runs_until_stable():
    # first call 50 ms (lazy init), then windows of 3 getting faster, then flat at 1 ms
    durations = [50_000_000] + [9_000_000] * 3 + [4_000_000] * 3 + [1_000_000] * 3 + [1_000_000] * 1000
    clock = FakeClock(durations)
    opts = BenchOptions(warmup_iters=3, warmup_max_seconds=60, min_iters=10, min_seconds=0.0)
    m = measure(lambda: None, opts, timer=clock)
    assert m.first_call_ns == 50_000_000
    assert m.warmup_iters == 12  # 9, 4, 1 ms windows improve; the second 1 ms window does not
    assert m.samples_ns == [1_000_000] * 10  # nothing from the first call or the warm-up


def test_measures_at_least_min_iters_and_min_seconds():
    opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0, min_iters=5, min_seconds=0.2)
    t0 = time.perf_counter()
    m = measure(lambda: time.sleep(0.01), opts)
    assert time.perf_counter() - t0 >= 0.2
    assert len(m.samples_ns) >= 5 and sum(m.samples_ns) >= 0.19e9
    fast = measure(lambda: None, BenchOptions(warmup_iters=1, min_iters=50, min_seconds=0.0, warmup_max_seconds=0))
    assert len(fast.samples_ns) == 50


def test_max_iters_caps_the_loop():
    opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0, min_iters=10, min_seconds=5.0, max_iters=30)
    assert len(measure(lambda: None, opts).samples_ns) == 30


def test_wall_clock_includes_sync():
    synced = []
    ns = wall_clock(lambda: (time.sleep(0.02), synced.append(1)))(lambda: None)
    assert synced == [1] and ns >= 0.02e9


def test_statistics_match_numpy():
    rng = np.random.default_rng(0)
    samples = (rng.lognormal(0, 0.3, 1000) * 1e6).astype(int).tolist()
    s = summarize(samples)
    ms = np.array(samples) / 1e6
    assert s["latency_ms_median"] == pytest.approx(np.median(ms))
    assert s["latency_ms_p90"] == pytest.approx(np.percentile(ms, 90))
    assert s["latency_ms_p99"] == pytest.approx(np.percentile(ms, 99))
    assert s["latency_ms_min"] == pytest.approx(ms.min()) and s["latency_ms_mean"] == pytest.approx(ms.mean())
    assert s["latency_cv"] == pytest.approx(ms.std(ddof=1) / ms.mean())
    assert s["iterations"] == 1000


def test_constant_samples_have_zero_cv():
    assert summarize([5_000_000] * 20)["latency_cv"] == 0.0
