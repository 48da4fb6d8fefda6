"""The measurement loop (tasks/measure/bench.py) and its statistics (tasks/measure/latency.py), on a controlled step function."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from tasks.measure.bench import bench_metrics, is_unstable, measure, wall_clock
from tasks.measure.latency import Latency, median_ci_ranks, summarize
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
    opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0, min_iters=5, min_seconds=0.2, max_seconds=5.0)
    t0 = time.perf_counter()
    m = measure(lambda: time.sleep(0.01), opts)
    assert time.perf_counter() - t0 >= 0.2
    assert len(m.samples_ns) >= 5 and sum(m.samples_ns) >= 0.19e9
    loose = BenchOptions(warmup_iters=1, min_iters=50, min_seconds=0.0, warmup_max_seconds=0, target_ci=10.0)
    fast = measure(lambda: None, loose)
    assert len(fast.samples_ns) == 50 and fast.reached_target


def test_the_machine_speed_probe_runs_between_calls_through_the_timed_window():
    """Probes before and after sampling and every PROBE_EVERY_NS of it, never inside a timed
    call: a step that records when it runs sees no probe while it runs."""
    from tasks.measure import bench

    inside, spans = [False], []
    real = bench.probe_loop

    def watched(n=bench.PROBE_LOOP):
        assert not inside[0], "a probe ran inside a timed call"
        spans.append(time.perf_counter_ns())
        return real(n)

    def step():
        inside[0] = True
        time.sleep(0.002)
        inside[0] = False

    opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0, min_iters=5, min_seconds=0.3, max_seconds=5.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "probe_loop", watched)
        m = measure(step, opts)
    assert len(m.probe_ns) == len(spans) and len(spans) % bench.PROBE_CALLS == 0
    # 0.3 s or more of sampling at one probe round per 50 ms, plus the rounds before and after
    assert len(spans) // bench.PROBE_CALLS >= 2 + 0.3e9 // bench.PROBE_EVERY_NS - 1
    metrics = bench_metrics(m, opts)
    assert metrics["machine_probe_us"] == pytest.approx(np.median(m.probe_ns) / 1e3)
    assert metrics["machine_probe_iqr_rel"] >= 0


def test_max_iters_caps_the_loop():
    opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0, min_iters=10, min_seconds=5.0, max_iters=30)
    m = measure(lambda: None, opts)
    assert len(m.samples_ns) == 30 and not m.hit_time_cap


def test_wall_clock_includes_sync():
    synced = []
    ns = wall_clock(lambda: (time.sleep(0.02), synced.append(1)))(lambda: None)
    assert synced == [1] and ns >= 0.02e9


# -- the adaptive stop: the scripted durations also drive the loop's notion of time ---------

QUICK = dict(warmup_iters=1, warmup_max_seconds=60, min_seconds=0.0)


def schedule(start: int, upto: int) -> list[int]:
    """The sample counts at which the stopping rule is checked: min_iters, then +10% each time."""
    out = [start]
    while out[-1] < upto:
        out.append(out[-1] + max(1, int(out[-1] * 0.1)))
    return out


def test_constant_clock_stops_at_min_iters_on_precision():
    m = measure(lambda: None, BenchOptions(min_iters=20, **QUICK), timer=FakeClock([1_000_000] * 10_000))
    assert len(m.samples_ns) == 20 and m.reached_target and not m.hit_time_cap


def test_noisy_clock_runs_until_the_median_is_precise():
    rng = np.random.default_rng(1)
    noisy = (rng.lognormal(0, 0.5, 100_000) * 1e6).astype(int).tolist()
    opts = BenchOptions(min_iters=20, target_ci=0.02, **QUICK)
    m = measure(lambda: None, opts, timer=FakeClock([1_000_000] * 3 + noisy))
    n = len(m.samples_ns)
    assert 200 < n < 100_000 and m.reached_target and not m.hit_time_cap
    assert n in schedule(20, n)  # checked every 10% more samples, not after each one
    assert summarize(m.samples_ns)["latency_median_ci_rel"] <= 0.02
    assert summarize(m.samples_ns[: schedule(20, n)[-2]])["latency_median_ci_rel"] > 0.02  # the check before: not yet
    # min_seconds holds it longer: 1 ms calls need at least 3000 of them for 3 s
    slow = measure(lambda: None, BenchOptions(min_iters=20, warmup_iters=1, min_seconds=3.0), timer=FakeClock(noisy))
    assert sum(slow.samples_ns) >= 3e9


def test_min_seconds_is_checked_where_the_calls_so_far_reach_it_not_up_to_10_percent_later_and_never_more():
    # 1 ms calls, precise at once: 1000 calls make the second, and the 1000th stops it (not the 1029th)
    m = measure(lambda: None, BenchOptions(min_iters=20, min_seconds=1.0, warmup_iters=1, warmup_max_seconds=60), timer=FakeClock([1_000_000] * 5000))
    assert len(m.samples_ns) == 1000 and m.reached_target
    # calls that slow down halfway: the check the first ones predicted finds the second short, and checks again
    m = measure(lambda: None, BenchOptions(min_iters=20, min_seconds=1.0, warmup_iters=1, warmup_max_seconds=60), timer=FakeClock([1_000_000] * 3 + [500_000] * 500 + [1_000_000] * 5000))
    reached = 500 + 750  # the call that makes the second
    assert reached <= len(m.samples_ns) <= 1.1 * reached and m.reached_target


def test_caps_are_flagged():
    # 1 s calls, 5 s allowed, 20 calls wanted: the time cap, too few samples for any CI
    capped = measure(lambda: None, BenchOptions(min_iters=20, max_seconds=5.0, **QUICK), timer=FakeClock([10**9] * 100))
    assert len(capped.samples_ns) == 5 and capped.hit_time_cap and not capped.reached_target
    assert "latency_ms_median_ci_low" not in summarize(capped.samples_ns)
    # very noisy calls and a low max_iters: stopped by the cap before the target
    rng = np.random.default_rng(2)
    noisy = (rng.lognormal(0, 1.0, 1000) * 1e6).astype(int).tolist()
    opts = BenchOptions(min_iters=20, max_iters=40, **QUICK)
    m = measure(lambda: None, opts, timer=FakeClock([1_000_000] * 3 + noisy))
    assert len(m.samples_ns) == 40 and not m.reached_target and not m.hit_time_cap
    metrics = bench_metrics(m, opts)
    assert metrics["reached_target"] == 0.0 and metrics["hit_time_cap"] == 0.0 and metrics["iterations"] == 40


def test_garbage_collector_is_off_only_while_sampling():
    seen = []
    step = lambda: seen.append(gc.isenabled())  # noqa: E731
    measure(step, BenchOptions(min_iters=10, **QUICK), timer=FakeClock([1_000_000] * 100))
    assert seen[:3] == [True] * 3  # first call + two warm-up windows of one
    assert seen[3:] == [False] * 10 and gc.isenabled()

    calls = iter(range(100))

    def boom():
        if next(calls) == 5:
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError):
        measure(boom, BenchOptions(min_iters=10, **QUICK), timer=FakeClock([1_000_000] * 100))
    assert gc.isenabled()


def test_what_was_frozen_before_the_timed_window_stays_frozen():
    """A forked benchmark's server froze its imports (tasks/worker/forks.py); gc has no partial
    unfreeze, so the window leaves a frozen heap frozen (and thaws only what it froze itself)."""
    gc.unfreeze()
    measure(lambda: None, BenchOptions(min_iters=10, **QUICK), timer=FakeClock([1_000_000] * 100))
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        measure(lambda: None, BenchOptions(min_iters=10, **QUICK), timer=FakeClock([1_000_000] * 100))
        assert gc.get_freeze_count() >= frozen > 0
    finally:
        gc.unfreeze()


# -- statistics -------------------------------------------------------------------------------


def test_statistics_match_numpy():
    rng = np.random.default_rng(0)
    samples = (rng.lognormal(0, 0.3, 1000) * 1e6).astype(int).tolist()
    s = summarize(samples)
    ms = np.array(samples) / 1e6
    q1, q3 = np.percentile(ms, [25, 75])
    assert s["latency_ms_median"] == pytest.approx(np.median(ms))
    assert s["latency_ms_p10"] == pytest.approx(np.percentile(ms, 10))
    assert s["latency_ms_p90"] == pytest.approx(np.percentile(ms, 90))
    assert s["latency_ms_p99"] == pytest.approx(np.percentile(ms, 99))
    assert s["latency_ms_min"] == pytest.approx(ms.min()) and s["latency_ms_mean"] == pytest.approx(ms.mean())
    assert s["latency_cv"] == pytest.approx(ms.std(ddof=1) / ms.mean())
    assert s["latency_ms_iqr"] == pytest.approx(q3 - q1)
    assert s["latency_iqr_rel"] == pytest.approx((q3 - q1) / np.median(ms))
    assert s["latency_ms_mad"] == pytest.approx(np.median(np.abs(ms - np.median(ms))))
    out_high = np.sum(ms > q3 + 1.5 * (q3 - q1))
    assert s["outliers_high"] == out_high and s["outliers"] == out_high + np.sum(ms < q1 - 1.5 * (q3 - q1))
    lo, hi = np.sort(ms)[[468, 531]]  # the order statistics of the 95% interval for n = 1000
    assert (s["latency_ms_median_ci_low"], s["latency_ms_median_ci_high"]) == pytest.approx((lo, hi))
    assert s["latency_median_ci_rel"] == pytest.approx((hi - lo) / 2 / np.median(ms))
    assert s["iterations"] == 1000
    assert Latency.from_values(samples).as_metrics() == s


def test_median_interval_is_the_binomial_one_and_covers():
    from scipy.stats import binom

    assert median_ci_ranks(5) is None  # [min, max] of 5 covers only 94%
    assert median_ci_ranks(6) == (0, 5)
    assert median_ci_ranks(100) == (39, 60)  # the textbook ranks 40 and 61
    for n in (6, 7, 20, 51, 100, 1000, 100_000):
        lo, hi = median_ci_ranks(n)
        assert hi == n - 1 - lo
        assert 1 - 2 * binom.cdf(lo, n, 0.5) >= 0.95 > 1 - 2 * binom.cdf(lo + 1, n, 0.5)  # the tightest such pair
    # the same ranks as scipy's binomial quantile for every n up to 2,000 and some beyond,
    # at three confidences (tasks.measure.bench sums the binomial tail itself, without scipy)
    for confidence in (0.9, 0.95, 0.99):
        q = (1 - confidence) / 2
        for n in (*range(2001), 12_345, 100_000, 200_001):
            k = int(binom.ppf(q, n, 0.5))
            k += binom.cdf(k, n, 0.5) <= q
            assert median_ci_ranks(n, confidence) == ((k - 1, n - k) if k >= 1 else None), (n, confidence)
    # empirically: it covers the true median of a skewed distribution about 95% of the time
    rng = np.random.default_rng(0)
    draws = np.sort(rng.exponential(1.0, (4000, 51)), axis=1)
    lo, hi = median_ci_ranks(51)
    covered = np.mean((draws[:, lo] <= np.log(2)) & (np.log(2) <= draws[:, hi]))
    assert 0.95 <= covered <= 0.985


def test_too_few_samples_report_only_what_exists():
    assert summarize([]) == {"iterations": 0.0}
    one = summarize([2_000_000])
    assert one == {
        "iterations": 1.0,
        "latency_ms_median": 2.0,
        "latency_ms_mean": 2.0,
        "latency_ms_min": 2.0,
        "latency_ms_max": 2.0,
    }
    two = summarize([1_000_000, 3_000_000])
    assert two["latency_ms_std"] == pytest.approx(np.sqrt(2)) and two["latency_ms_iqr"] == pytest.approx(1.0)
    assert "latency_ms_median_ci_low" not in two and "latency_median_ci_rel" not in two  # needs 6
    assert "latency_ms_median_ci_low" in summarize([1_000_000] * 6)
    opts = BenchOptions()
    assert not is_unstable(one, opts) and not Latency.from_values([1]).is_unstable(0.1)


def test_constant_samples_have_zero_spread():
    s = summarize([5_000_000] * 20)
    assert s["latency_cv"] == 0.0 and s["latency_iqr_rel"] == 0.0 and s["latency_median_ci_rel"] == 0.0
    assert s["outliers"] == 0.0


def stalls(rng, n: int, median_ms: float = 0.07) -> np.ndarray:
    """Tiny-model calls as measured: lognormal around the median, rare 4-12 ms stalls."""
    ms = median_ms * rng.lognormal(0, 0.03, n)
    hit = rng.random(n) < 0.005
    ms[hit] = rng.uniform(4, 12, hit.sum())
    return (ms * 1e6).astype(np.int64)


def test_unstable_is_judged_on_the_iqr_not_the_cv():
    rng = np.random.default_rng(0)
    opts = BenchOptions()
    assert opts.unstable_iqr == 0.10
    calm = summarize(stalls(rng, 5000).tolist())
    assert calm["latency_cv"] > 1.0 and calm["latency_iqr_rel"] < 0.10 and calm["outliers_high"] > 0
    assert not is_unstable(calm, opts)
    wide = summarize((rng.lognormal(0, 0.3, 5000) * 1e6).astype(int).tolist())
    assert wide["latency_iqr_rel"] > 0.10 and is_unstable(wide, opts)
    assert is_unstable(calm, BenchOptions(unstable_iqr=0.01))


def test_repeats_pool_samples_rescale_rates_and_keep_raised_flags():
    from tasks.measure.bench import pool_repeats
    from tasks.specs import BenchResult

    def process(median_ns: int, shared: float, pid: int) -> BenchResult:
        samples = [median_ns] * 50
        metrics = {**summarize(samples), "tokens_per_s": 1e9 / median_ns, "load_seconds": pid / 10}
        metrics.update(shared_cores=shared, parity_max_abs_diff=1e-6 * pid)
        params = {"pid": pid, "ray_node": "a" if pid < 3 else "b", "process_start": "forked"}
        return BenchResult("v", True, metrics, params, {"steps": 1}, samples)

    opts = BenchOptions()
    pooled = pool_repeats([process(1_000_000, 0.0, 1), process(1_200_000, 1.0, 2), process(1_100_000, 0.0, 3)], opts)
    assert pooled.ok and len(pooled.samples_ns) == 150 and pooled.metrics["repeats"] == 3
    assert pooled.metrics["latency_ms_median"] == pytest.approx(1.1)
    assert pooled.metrics["latency_repeat_spread"] == pytest.approx(0.2 / 1.1)
    assert pooled.metrics["tokens_per_s"] == pytest.approx(1e3 / 1.1)  # from the pooled median
    assert pooled.metrics["load_seconds"] == pytest.approx(0.2)  # the median process
    assert pooled.metrics["shared_cores"] == 1.0 and pooled.metrics["parity_max_abs_diff"] == pytest.approx(3e-6)
    assert pooled.params["pid"] == "1,2,3"
    assert pooled.params["ray_node"] == "a,a,b" and pooled.params["process_start"] == "forked"  # differs: listed
    failed = BenchResult("v", False)
    assert pool_repeats([process(1_000_000, 0.0, 1), failed], opts) is failed
