"""The benchmark's call timed in an application's rhythm: each call after a gap spent as an
application spends the time between two of its forwards, running Python on the calling thread
(a busy wait). A benchmark times calls back to back; an application's loop calls the runtime
after a gap in which the runtime's worker threads park and what the call reads leaves the
caches, so its calls take longer, the more so the longer the gap; and a step on a growing
cache (model.kv_cache=dynamic) takes a cache one position longer than the step before, a
shape the runtime has not run last, so these calls alternate between the captured cache and
the same one position shorter. The headline figures stay
back to back (the runtime at its best); these are recorded beside them for a captured call
(tasks/specs.py BenchSpec.rhythm_gap_ms, its application's gap on transformers):

  rhythm_latency_ms_{median,mean,p90}  at the application's gap measured by its capture
  series rhythm_by_gap_ms_{median,mean}  by gap (step: the gap in microseconds), at GAPS_MS and
                                         that gap: what a prediction reads at the gap the
                                         application shows on the runtime itself"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tasks.specs import PAST

GAPS_MS = (0.1, 0.3, 1.0, 3.0)  # the gaps every captured call is timed after
CALLS = 300  # at most, per gap: as many as a generation of the bundled application makes in one run
MIN_CALLS = 30  # at least, per gap
MAX_SECONDS = 1.0  # per gap, once MIN_CALLS are in
MEDIAN, MEAN = "rhythm_latency_ms_median", "rhythm_latency_ms_mean"
BY_GAP = ("rhythm_by_gap_ms_median", "rhythm_by_gap_ms_mean")  # series: a step's metric must not share a scalar's name


def busy(ns: int) -> None:
    """Run Python on this thread for `ns` nanoseconds."""
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def shorter(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """A decode step's feeds on a growing cache one position shorter (its previous step's shape);
    None for feeds with no cache to shorten."""
    past = [n for n in feeds if n.startswith(PAST)]
    if not past or "cache_position" not in feeds or feeds[past[0]].shape[2] < 2:
        return None
    out = {n: np.ascontiguousarray(a[:, :, :-1]) if n in past else a for n, a in feeds.items()}
    out["cache_position"] = feeds["cache_position"] - 1
    return out


def paced(calls: list[Callable[[], object]], gap_ms: float, timer: Callable[[Callable[[], object]], int]) -> list[int]:
    """The durations (ns) of the calls, taken in turn, each after `gap_ms` of busy Python: CALLS
    of them, or fewer (MIN_CALLS at least) once MAX_SECONDS have passed."""
    gap = max(0, int(gap_ms * 1e6))
    out: list[int] = []
    start = time.perf_counter_ns()
    while len(out) < CALLS and (len(out) < MIN_CALLS or time.perf_counter_ns() - start < MAX_SECONDS * 1e9):
        busy(gap)
        out.append(timer(calls[len(out) % len(calls)]))
    return out


def in_rhythm(
    calls: list[Callable[[], object]], gap_ms: float, timer: Callable[[Callable[[], object]], int]
) -> tuple[dict[str, float], dict[str, list[tuple[int, float]]]]:
    """(metrics at `gap_ms`, series by gap) of `calls`, in turn, timed after each gap, shortest first."""
    metrics: dict[str, float] = {}
    series: dict[str, list[tuple[int, float]]] = {k: [] for k in BY_GAP}
    for gap in sorted({*GAPS_MS, round(gap_ms, 3)}):
        ms = np.asarray(paced(calls, gap, timer), dtype=np.float64) / 1e6
        median, mean = float(np.median(ms)), float(ms.mean())
        series[BY_GAP[0]].append((round(gap * 1e3), median))
        series[BY_GAP[1]].append((round(gap * 1e3), mean))
        if gap == round(gap_ms, 3):
            metrics = {MEDIAN: median, MEAN: mean, "rhythm_latency_ms_p90": float(np.percentile(ms, 90)),
                       "rhythm_gap_ms": gap, "rhythm_calls": float(ms.size)}  # fmt: skip
    return metrics, series
