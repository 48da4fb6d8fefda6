"""The measurement loop and its statistics. Backend-agnostic: it times a zero-argument call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tasks.specs import BenchOptions


@dataclass
class Measurement:
    samples_ns: list[int]  # one wall-clock duration per timed call
    first_call_ns: int  # the very first call: lazy init, allocation, compilation
    warmup_iters: int
    warmup_seconds: float


def wall_clock(sync: Callable[[], None]) -> Callable[[Callable[[], object]], int]:
    """Host timer: perf_counter_ns around the call and `sync` (a no-op on CPU backends)."""

    def timed(step: Callable[[], object]) -> int:
        t0 = time.perf_counter_ns()
        step()
        sync()
        return time.perf_counter_ns() - t0

    return timed


def measure(
    step: Callable[[], object],
    opts: BenchOptions,
    sync: Callable[[], None] = lambda: None,
    timer: Callable[[Callable[[], object]], int] | None = None,
) -> Measurement:
    """Time `step`: first call, warm-up until stable, then at least min_iters and min_seconds.

    `timer(step) -> ns` defaults to the host clock; GPU sessions pass one built on CUDA
    events, which times the device work itself and synchronises on the end event."""
    timed = timer or wall_clock(sync)
    first = timed(step)

    # warm-up in windows of warmup_iters calls, until a window's median stops improving
    # by more than 2% over the previous one (first-run effects gone), within a time cap
    w = max(1, opts.warmup_iters)
    t0 = time.perf_counter()
    prev = float("inf")
    iters = 0
    while True:
        window = [timed(step) for _ in range(w)]
        iters += w
        med = float(np.median(window))
        if med >= 0.98 * prev or time.perf_counter() - t0 >= opts.warmup_max_seconds:
            break
        prev = med
    warmup_seconds = time.perf_counter() - t0

    samples: list[int] = []
    start = time.perf_counter_ns()
    while True:
        samples.append(timed(step))
        elapsed = (time.perf_counter_ns() - start) / 1e9
        n = len(samples)
        if n >= opts.max_iters or elapsed >= opts.max_seconds:
            break
        if n >= opts.min_iters and elapsed >= opts.min_seconds:
            break
    return Measurement(samples, first, iters, warmup_seconds)


def summarize(samples_ns: list[int]) -> dict[str, float]:
    """Latency statistics in milliseconds, plus the coefficient of variation (std / mean)."""
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    mean = float(ms.mean())
    std = float(ms.std(ddof=1)) if ms.size > 1 else 0.0
    return {
        "latency_ms_median": float(np.median(ms)),
        "latency_ms_mean": mean,
        "latency_ms_p90": float(np.percentile(ms, 90)),
        "latency_ms_p99": float(np.percentile(ms, 99)),
        "latency_ms_min": float(ms.min()),
        "latency_ms_max": float(ms.max()),
        "latency_ms_std": std,
        "latency_cv": std / mean if mean > 0 else 0.0,
        "iterations": float(ms.size),
    }
