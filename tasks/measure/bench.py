"""The measurement loop and the metrics it logs. Backend-agnostic: it times a zero-argument
call. The samples' statistics are tasks/measure/latency.py's."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from tasks.measure.latency import median_ci_rel, ratio, summarize
from tasks.specs import BenchOptions, BenchResult

CHECK_GROWTH = 0.10  # past min_seconds, the stopping rule is checked each time the sample count grew by 10%
# The machine's own speed, probed between timed calls: PROBE_CALLS runs of a fixed Python loop
# every PROBE_EVERY_NS. A virtual core's speed can change for seconds with no counter showing
# it; the probe's spread says so within a run, its median between runs (orchestrator/read/verdict_table.py).
PROBE_EVERY_NS = 50_000_000
PROBE_CALLS = 3
PROBE_LOOP = 2_000  # iterations of the probe loop


@dataclass
class Measurement:
    samples_ns: list[int]  # one wall-clock duration per timed call
    first_call_ns: int  # the very first call: lazy init, allocation, compilation
    warmup_iters: int
    warmup_seconds: float
    reached_target: bool = False  # the median's CI half-width ended within bench.target_ci of it
    hit_time_cap: bool = False  # max_seconds ran out before min_iters calls were timed
    probe_ns: list[int] = field(default_factory=list)  # the machine-speed probe's timings (PROBE_*)


def probe_loop(n: int = PROBE_LOOP) -> int:
    """The machine-speed probe's fixed work: a pure-Python loop (no allocation, no I/O)."""
    total = 0
    for i in range(n):
        total += i
    return total


def probe(samples: list[int], calls: int = PROBE_CALLS) -> None:
    """Time `calls` runs of probe_loop() into `samples` (ns)."""
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        probe_loop()
        samples.append(time.perf_counter_ns() - t0)


def wall_clock(sync: Callable[[], None]) -> Callable[[Callable[[], object]], int]:
    """Host timer: perf_counter_ns around the call and `sync` (a no-op on CPU backends)."""

    def timed(step: Callable[[], object]) -> int:
        t0 = time.perf_counter_ns()
        step()
        sync()
        return time.perf_counter_ns() - t0

    return timed


def warm_up(timed: Callable[[Callable[[], object]], int], step: Callable[[], object], opts: BenchOptions) -> tuple[int, float, float]:
    """Calls in windows of warmup_iters until a window's median stops improving by more than
    2% over the previous one (first-run effects gone), within warmup_max_seconds; returns
    (calls, seconds, the last window's median ns)."""
    w = max(1, opts.warmup_iters)
    t0 = time.perf_counter()
    prev = float("inf")
    iters = 0
    while True:
        window = [timed(step) for _ in range(w)]
        iters += w
        med = float(np.median(window))
        if med >= 0.98 * prev or time.perf_counter() - t0 >= opts.warmup_max_seconds:
            return iters, time.perf_counter() - t0, med
        prev = med


def measure(
    step: Callable[[], object],
    opts: BenchOptions,
    sync: Callable[[], None] = lambda: None,
    timer: Callable[[Callable[[], object]], int] | None = None,
) -> Measurement:
    """Time `step`: first call, warm-up until stable, then sample until the median is precise.

    Sampling stops once the 95% confidence interval of the median is within `target_ci` of
    it (half-width / median) and at least min_iters calls and min_seconds have passed, or
    at max_iters / max_seconds, whichever comes first (torch.utils.benchmark's
    adaptive_autorange). Time is the larger of the loop's wall time and the sum of the timed
    durations, so a scripted timer drives the rule exactly. The rule is checked every 10%
    more samples, or sooner where the calls so far say min_seconds is reached, never inside a
    timed call. The garbage collector is frozen and disabled while sampling (as pyperf does),
    so no collection lands in a sample. The machine's speed is probed before, every
    PROBE_EVERY_NS during and after sampling (`probe_ns`).

    `timer(step) -> ns` defaults to the host clock; GPU sessions pass one built on CUDA
    events, which times the device work itself and synchronises on the end event."""
    timed = timer or wall_clock(sync)
    first = timed(step)
    iters, warmup_seconds, _ = warm_up(timed, step, opts)
    probes: list[int] = []
    with gc_paused():
        probe(probes)
        samples, elapsed = _sample(timed, step, opts, probes)
        probe(probes)
    rel = median_ci_rel(samples)
    return Measurement(
        samples,
        first,
        iters,
        warmup_seconds,
        reached_target=rel is not None and rel <= opts.target_ci,
        hit_time_cap=elapsed >= opts.max_seconds * 1e9 and len(samples) < opts.min_iters,
        probe_ns=probes,
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """The garbage collector frozen and disabled inside, as it was after."""
    gc_enabled = gc.isenabled()
    frozen_before = gc.get_freeze_count()  # a forked child holds its server's imports frozen (tasks/worker/forks.py)
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if gc_enabled:
            gc.enable()
        if not frozen_before:  # gc has no partial unfreeze: what was frozen before the window stays so
            gc.unfreeze()


def _sample(timed: Callable[[Callable[[], object]], int], step: Callable[[], object], opts: BenchOptions, probes: list[int]) -> tuple[list[int], float]:
    """(samples, elapsed ns) of timed calls until the stopping rule holds, the machine probed
    every PROBE_EVERY_NS between calls."""
    min_ns, max_ns = opts.min_seconds * 1e9, opts.max_seconds * 1e9
    samples: list[int] = []
    total = 0  # sum of the timed durations, ns
    check_at = max(1, opts.min_iters)
    start = time.perf_counter_ns()
    next_probe = PROBE_EVERY_NS
    while True:
        d = timed(step)
        samples.append(d)
        total += d
        n = len(samples)
        wall = time.perf_counter_ns() - start
        if wall >= next_probe:
            probe(probes)
            next_probe = wall + PROBE_EVERY_NS
        elapsed = max(wall, total)
        if n >= opts.max_iters or elapsed >= max_ns:
            return samples, elapsed
        if n >= check_at:
            if elapsed >= min_ns:
                rel = median_ci_rel(samples)
                if rel is not None and rel <= opts.target_ci:
                    return samples, elapsed
            grown = n + max(1, int(n * CHECK_GROWTH))
            # short of min_seconds: no later than where the calls so far say it is reached
            check_at = grown if elapsed >= min_ns else max(n + 1, min(grown, math.ceil(n * min_ns / max(elapsed, 1))))


# -- metrics ------------------------------------------------------------------------------


def is_unstable(stats: Mapping[str, float], opts: BenchOptions) -> bool:
    """The `unstable` flag from summarize()'s metrics: IQR / median above bench.unstable_iqr
    (torch.utils.benchmark warns above 10%). False when the IQR does not exist (< 2 samples)."""
    iqr_rel = stats.get("latency_iqr_rel")
    return iqr_rel is not None and iqr_rel > opts.unstable_iqr


def probe_metrics(probe_ns: Iterable[int]) -> dict[str, float]:
    """The machine-speed probe's median (us) and IQR / median: `machine_probe_us`,
    `machine_probe_iqr_rel`. Empty without probes."""
    us = np.asarray(list(probe_ns), dtype=np.float64) / 1e3
    if us.size == 0:
        return {}
    p25, median, p75 = (float(v) for v in np.percentile(us, [25, 50, 75]))
    return {"machine_probe_us": median, "machine_probe_iqr_rel": ratio(p75 - p25, median) or 0.0}


def bench_metrics(m: Measurement, opts: BenchOptions) -> dict[str, float]:
    """summarize(m.samples_ns) plus the loop's verdicts as 0/1 metrics: `unstable`,
    `reached_target`, `hit_time_cap`, and the machine-speed probe's probe_metrics()."""
    stats = summarize(m.samples_ns)
    return {
        **stats,
        "unstable": float(is_unstable(stats, opts)),
        "reached_target": float(m.reached_target),
        "hit_time_cap": float(m.hit_time_cap),
        **probe_metrics(m.probe_ns),
    }


# metrics that follow from the pooled median rather than from any one process
_PER_MEDIAN = (
    "tokens_per_s", "tokens_per_s_per_sequence", "achieved_bandwidth_gbs", "bandwidth_fraction_of_peak", "bandwidth_share",
)  # fmt: skip
_WORST = ("shared_cores", "other_cpu_fraction", "hit_time_cap", "compile_recompiles", "parity_cache_max_abs_diff")


def pool_repeats(results: list[BenchResult], opts: BenchOptions) -> BenchResult:
    """One variant measured in several fresh processes: the samples pooled, the latency
    statistics and the flag recomputed from them, rates rescaled to the pooled median, the
    other metrics (load time, peak memory, first call) the median over processes, and the
    spread between the processes' medians reported; a param the processes differ in lists
    each one's value. A failed process fails the variant."""
    failed = next((r for r in results if not r.ok), None)
    if failed is not None or len(results) == 1:
        return failed or results[0]
    first = results[0]
    pooled = [s for r in results for s in r.samples_ns]
    medians = [r.metrics["latency_ms_median"] for r in results]
    metrics = {k: float(np.median([r.metrics[k] for r in results if k in r.metrics])) for k in first.metrics}
    for key in _WORST:  # a flag any process raised stays raised
        if key in metrics:
            metrics[key] = max(r.metrics.get(key, 0.0) for r in results)
    for key in [k for k in metrics if k.startswith(("latency_", "outliers", "iterations"))]:
        del metrics[key]
    stats = summarize(pooled)
    metrics.update(stats, unstable=float(is_unstable(stats, opts)))
    for key in _PER_MEDIAN:
        if key in first.metrics:  # rate x median is constant: rescale to the pooled median
            metrics[key] = first.metrics[key] * first.metrics["latency_ms_median"] / stats["latency_ms_median"]
    metrics.update(
        repeats=float(len(results)),
        latency_repeat_spread=(max(medians) - min(medians)) / stats["latency_ms_median"],
        parity_max_abs_diff=max(r.metrics["parity_max_abs_diff"] for r in results),
    )
    worst = max(results, key=lambda r: r.metrics["parity_max_abs_diff"])
    # a param the processes differ in (their pids; the node each ran on, how it got its export)
    # lists each process's value in order: a variant measured on two machines says so
    params = {
        k: ",".join(str(r.params.get(k)) for r in results) if len({str(r.params.get(k)) for r in results}) > 1 else v
        for k, v in first.params.items()
    }
    params["repeat_medians_ms"] = ",".join(f"{m:.4g}" for m in medians)
    return BenchResult(
        variant=first.variant,
        ok=True,
        metrics=metrics,
        params=params,
        parity=worst.parity,
        samples_ns=pooled,
        first_call_ns=first.first_call_ns,
        env=first.env,
        profile=first.profile,  # one process's profile: where time goes, not how long
        series=pool_series([r.series for r in results]),
    )


def pool_series(each: list[dict[str, list[tuple[int, float]]]]) -> dict[str, list[tuple[int, float]]]:
    """Several processes' series as one: at each step, the median of the processes' values."""
    steps: dict[str, dict[int, list[float]]] = {}
    for series in each:
        for key, points in series.items():
            for step, value in points:
                steps.setdefault(key, {}).setdefault(step, []).append(value)
    return {k: [(s, float(np.median(v))) for s, v in sorted(by.items())] for k, by in steps.items()}
