"""A variant's latency samples as statistics. Latency samples of small calls are heavy-tailed
(rare stalls many times the median), so the statistics that decide anything are rank-based:
the median with a distribution-free 95% confidence interval, the IQR, the MAD. Mean, std and
their ratio are kept as information.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

CONFIDENCE = 0.95  # of the median's interval, in the stopping rule and the statistics


@lru_cache(maxsize=512)
def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) into n sorted samples of the distribution-free confidence
    interval of the median: [x_(l), x_(n-l+1)] (1-based) with the largest l such that
    P(B <= l-1) <= (1 - confidence) / 2 for B ~ Binomial(n, 1/2), so its coverage is at
    least `confidence` whatever the distribution. None when no such l exists (n < 6 at 95%).

    The binomial's lower tail is summed exactly here, in numpy (log C(n, i) as a running sum
    of log((n-i+1)/i)), not by scipy.stats: importing scipy.stats takes about a second, and a
    benchmark's process would pay it inside its timed window (tests/test_bench.py checks the
    ranks against scipy's)."""
    q = (1 - confidence) / 2
    i = np.arange(1, n // 2 + 1, dtype=np.float64)  # P(B <= n//2) >= 1/2 > q: the tail ends there
    log_pmf = np.concatenate(([0.0], np.cumsum(np.log(n - i + 1) - np.log(i)))) - n * np.log(2.0)
    cdf = np.cumsum(np.exp(log_pmf))
    k = int(np.searchsorted(cdf, q, side="right"))  # the smallest k with P(B <= k) > q
    if k < 1:
        return None
    return k - 1, n - k


def ratio(num: float, den: float) -> float | None:
    """num / den; 0 when num is 0; None (undefined) when den is not positive."""
    if num == 0:
        return 0.0
    return num / den if den > 0 else None


def median_ci_rel(samples: Iterable[int] | np.ndarray) -> float | None:
    """Half-width of the median's 95% CI relative to the median; None below 6 samples."""
    a = np.asarray(samples if isinstance(samples, list | tuple | np.ndarray) else list(samples))
    n = a.size
    ranks = median_ci_ranks(n) if n else None
    if ranks is None:
        return None
    lo, hi = ranks
    mid = sorted({(n - 1) // 2, n // 2})
    part = np.partition(a, sorted({lo, hi, *mid}))
    median = float(np.mean(part[mid]))
    return ratio((float(part[hi]) - float(part[lo])) / 2, median)


@dataclass(frozen=True)
class Latency:
    """Statistics of one variant's latency samples, in milliseconds.

    A statistic is None, and left out of `as_metrics()`, when there are too few samples for
    it to exist: 1 sample has a median, mean, min and max and nothing else; a spread needs
    2; the median's 95% interval needs 6. Outliers follow torch.utils.benchmark: samples
    outside [Q1 - 1.5 IQR, Q3 + 1.5 IQR]. MAD is the raw median absolute deviation (not
    scaled to estimate a normal's sigma)."""

    iterations: int
    median: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p10: float | None = None
    p90: float | None = None
    p99: float | None = None
    std: float | None = None  # sample standard deviation (ddof=1)
    iqr: float | None = None  # p75 - p25
    mad: float | None = None  # median(|x - median|)
    median_ci_low: float | None = None
    median_ci_high: float | None = None
    iqr_rel: float | None = None  # IQR / median: what `unstable` is judged on
    cv: float | None = None  # std / mean: informational; heavy tails inflate it
    median_ci_rel: float | None = None  # CI half-width / median
    outliers: int | None = None
    outliers_high: int | None = None

    METRIC_NAMES = {
        "median": "latency_ms_median",
        "mean": "latency_ms_mean",
        "min": "latency_ms_min",
        "max": "latency_ms_max",
        "p10": "latency_ms_p10",
        "p90": "latency_ms_p90",
        "p99": "latency_ms_p99",
        "std": "latency_ms_std",
        "iqr": "latency_ms_iqr",
        "mad": "latency_ms_mad",
        "median_ci_low": "latency_ms_median_ci_low",
        "median_ci_high": "latency_ms_median_ci_high",
        "iqr_rel": "latency_iqr_rel",
        "cv": "latency_cv",
        "median_ci_rel": "latency_median_ci_rel",
        "outliers": "outliers",
        "outliers_high": "outliers_high",
        "iterations": "iterations",
    }

    @classmethod
    def from_values(cls, samples_ns: Iterable[int]) -> Latency:
        ms = np.sort(np.asarray(list(samples_ns), dtype=np.float64)) / 1e6
        n = int(ms.size)
        if n == 0:
            return cls(iterations=0)
        median, mean = float(np.median(ms)), float(ms.mean())
        one = dict(iterations=n, median=median, mean=mean, min=float(ms[0]), max=float(ms[-1]))
        if n < 2:
            return cls(**one)
        p10, p25, p75, p90, p99 = (float(v) for v in np.percentile(ms, [10, 25, 75, 90, 99]))
        std, iqr = float(ms.std(ddof=1)), p75 - p25
        high = int(np.count_nonzero(ms > p75 + 1.5 * iqr))
        ci = {}
        ranks = median_ci_ranks(n)
        if ranks is not None:
            low_ms, high_ms = float(ms[ranks[0]]), float(ms[ranks[1]])
            ci = dict(
                median_ci_low=low_ms, median_ci_high=high_ms, median_ci_rel=ratio((high_ms - low_ms) / 2, median)
            )
        return cls(
            **one,
            p10=p10,
            p90=p90,
            p99=p99,
            std=std,
            iqr=iqr,
            mad=float(np.median(np.abs(ms - median))),
            iqr_rel=ratio(iqr, median),
            cv=ratio(std, mean),
            outliers=high + int(np.count_nonzero(ms < p25 - 1.5 * iqr)),
            outliers_high=high,
            **ci,
        )

    def as_metrics(self) -> dict[str, float]:
        """The flat metrics dict, statistics that do not exist left out."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[self.METRIC_NAMES[f.name]] = float(value)
        return out

    def is_unstable(self, threshold: float) -> bool:
        """IQR / median above `threshold`; False when there is no IQR (fewer than 2 samples)."""
        return self.iqr_rel is not None and self.iqr_rel > threshold


def summarize(samples_ns: Iterable[int]) -> dict[str, float]:
    """`Latency.from_values(samples_ns).as_metrics()`: latency statistics in milliseconds."""
    return Latency.from_values(samples_ns).as_metrics()
