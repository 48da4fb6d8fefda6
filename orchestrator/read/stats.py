"""The regression verdict's statistics: two runs' latency samples compared on contiguous
blocks (consecutive calls share the machine's state, so single calls are not independent)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.measure.effect import band, side

BLOCKS = 20  # contiguous blocks per run: the unit of the bootstrap and of the rank test
SKETCH = 101  # quantiles kept per block
VERDICTS = ("slower", "faster", "same", "inconclusive")
# a change a disturbed variant (shared cores, or a machine-speed change between the runs) needs
# to be called: within-run noise says nothing of a load or speed that came or went between sweeps
DISTURBED_MIN_EFFECT = 0.5


def block_sketches(samples: np.ndarray, blocks: int = BLOCKS) -> np.ndarray:
    """(k, SKETCH): the samples, in timed order, cut into k = min(blocks, n) contiguous blocks,
    each kept as SKETCH quantiles (a resample's median to within a quantile step, at fixed cost)."""
    x = np.asarray(samples, dtype=np.float64)
    k = max(1, min(blocks, x.size))
    q = np.linspace(0, 1, SKETCH)
    return np.stack([np.quantile(b, q) for b in np.array_split(x, k)])


def block_bootstrap_medians(sketches: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of `resamples` non-overlapping block bootstrap resamples: k blocks drawn with
    replacement from the k of block_sketches(), the median of their pooled quantiles."""
    k = sketches.shape[0]
    drawn = sketches[rng.integers(0, k, (resamples, k))]  # (resamples, k, SKETCH)
    return np.median(drawn.reshape(resamples, -1), axis=1)


def verdict(
    ci_low: float,
    ci_high: float,
    p: float,
    min_effect: float = 0.05,
    alpha: float = 0.05,
    call: float | None = None,
    speed: float = 1.0,
) -> str:
    """slower / faster / same / inconclusive from the ratio's interval and a (corrected) p-value.
    `same`: within [1 - min_effect, 1 + min_effect]; slower/faster need the interval beyond
    `call` (default min_effect) and beyond the machine's own `speed` change by min_effect."""
    call = min_effect if call is None else call
    called = side((ci_low, ci_high), min(1 - call, speed * (1 - min_effect)), max(1 + call, speed * (1 + min_effect)))
    if called in ("above", "below") and p < alpha:
        return "slower" if called == "above" else "faster"
    return "same" if side((ci_low, ci_high), *band(min_effect)) == "within" else "inconclusive"


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input's order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def compare_samples(
    baseline_ns: Sequence[int] | np.ndarray,
    candidate_ns: Sequence[int] | np.ndarray,
    min_effect: float = 0.05,
    alpha: float = 0.05,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """One variant, samples in timed order: ratio of medians (candidate / baseline), its
    block-bootstrap interval, the Mann-Whitney U p of the blocks' medians, and the uncorrected verdict."""
    from scipy.stats import mannwhitneyu  # lazy: scipy, only for a verdict

    a = np.asarray(baseline_ns, dtype=np.float64)
    b = np.asarray(candidate_ns, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("both sides need at least one sample")
    med_a, med_b = float(np.median(a)), float(np.median(b))
    sk_a, sk_b = block_sketches(a), block_sketches(b)
    rng = np.random.default_rng(seed)
    boot_a = block_bootstrap_medians(sk_a, rng, resamples)
    boot_b = block_bootstrap_medians(sk_b, rng, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = boot_b / boot_a
    tail = (1 - confidence) / 2 * 100
    low, high = (float(v) for v in np.nanpercentile(ratios, [tail, 100 - tail]))
    ratio = med_b / med_a if med_a > 0 else float("inf")
    low, high = min(low, ratio), max(high, ratio)  # the sketch's quantile steps can leave it a hair outside
    mid = SKETCH // 2  # each block's median
    p = float(mannwhitneyu(sk_a[:, mid], sk_b[:, mid], alternative="two-sided").pvalue)
    if not np.isfinite(p):
        p = 1.0
    return {
        "n_baseline": int(a.size),
        "n_candidate": int(b.size),
        "blocks": [int(sk_a.shape[0]), int(sk_b.shape[0])],
        "median_baseline_ms": med_a / 1e6,
        "median_candidate_ms": med_b / 1e6,
        "ratio": ratio,
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "p_value": p,
        "verdict": verdict(low, high, p, min_effect, alpha),
    }


def compare_paired(pair: Mapping[str, Any], min_effect: float = 0.05, alpha: float = 0.05) -> dict[str, Any]:
    """One variant re-measured interleaved (tasks/paired.py): the median of its per-round ratios
    candidate / baseline with their distribution-free interval, and a sign test's p that the
    rounds' ratios sit above 1 as often as below."""
    from scipy.stats import binomtest  # lazy: scipy, only for a verdict

    ratios = np.asarray(pair["ratios"], dtype=np.float64)
    above, below = int((ratios > 1).sum()), int((ratios < 1).sum())
    p = float(binomtest(above, above + below, 0.5).pvalue) if above + below else 1.0
    low, high = pair["ci"]
    return {
        "n_baseline": len(pair["samples_ns"]["baseline"]),
        "n_candidate": len(pair["samples_ns"]["candidate"]),
        "rounds": len(ratios),
        "median_baseline_ms": float(np.median(pair["block_ns"]["baseline"])) / 1e6,
        "median_candidate_ms": float(np.median(pair["block_ns"]["candidate"])) / 1e6,
        "ratio": float(pair["ratio"]),
        "ratio_ci_low": float(low),
        "ratio_ci_high": float(high),
        "p_value": p,
        "measured": f"interleaved, {len(ratios)} rounds",
        "verdict": verdict(low, high, p, min_effect, alpha),
    }


def compare_sweeps(
    baseline: dict[str, Sequence[int]],
    candidate: dict[str, Sequence[int]],
    min_effect: float = 0.05,
    alpha: float = 0.05,
    resamples: int = 2000,
    seed: int = 0,
    disturbed: Mapping[str, str] | None = None,
    speeds: Mapping[str, float] | None = None,
    paired: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """{variant: samples} of two sweeps -> each common variant's comparison (Holm-corrected
    `p_holm`, final `verdict`) and the variants only one has. A variant in `disturbed` ({name:
    why}) is called slower/faster only beyond DISTURBED_MIN_EFFECT and its `speeds` change. A
    variant in `paired` (its interleaved re-measurement: compare_paired) is judged on that instead."""
    disturbed, speeds, paired = disturbed or {}, speeds or {}, paired or {}
    common = sorted(set(baseline) & set(candidate))
    results = [
        {"variant": name, **(
            compare_paired(paired[name], min_effect, alpha) if name in paired
            else compare_samples(baseline[name], candidate[name], min_effect, alpha, resamples, seed)
        )}
        for name in common
    ]
    for r, p in zip(results, holm([r["p_value"] for r in results]), strict=True):
        r["p_holm"] = p
        r["disturbed"] = None if r["variant"] in paired else disturbed.get(r["variant"])  # drift fell on both sides
        call, speed = (max(min_effect, DISTURBED_MIN_EFFECT), speeds.get(r["variant"], 1.0)) if r["disturbed"] else (min_effect, 1.0)
        r["verdict"] = verdict(r["ratio_ci_low"], r["ratio_ci_high"], p, min_effect, alpha, call, speed)
    return {
        "min_effect": min_effect,
        "alpha": alpha,
        "resamples": resamples,
        "variants": results,
        "only_in_baseline": sorted(set(baseline) - set(candidate)),
        "only_in_candidate": sorted(set(candidate) - set(baseline)),
    }


@dataclass(frozen=True)
class Conditions:
    """How one run's timed window went, from its metrics (tasks/measure/machine.py, tasks/measure/bench.py)."""

    shared_cores: bool = False  # other processes took more than 5% of the bench cores' time
    probe_us: float | None = None  # the machine-speed probe's median; None in runs from before it

    @classmethod
    def of(cls, metrics: Mapping[str, float]) -> Conditions:
        return cls(metrics.get("shared_cores", 0.0) >= 1, metrics.get("machine_probe_us"))


def speed_change(base: Conditions, cand: Conditions) -> float | None:
    """The candidate's machine-speed probe over the baseline's (> 1: slower machine); None without probes."""
    return cand.probe_us / base.probe_us if base.probe_us and cand.probe_us else None


def disturbance(base: Conditions, cand: Conditions, min_effect: float) -> str | None:
    """Why two runs' latencies may not compare (shared cores; a machine-speed change beyond
    min_effect), or None."""
    why = ["shared cores"] if base.shared_cores or cand.shared_cores else []
    speed = speed_change(base, cand)
    if speed is not None and abs(speed - 1) > min_effect:
        why.append(f"machine speed {1 / speed:.2f}x")
    return "; ".join(why) or None


def disturbances(
    base: Mapping[str, Conditions], cand: Mapping[str, Conditions], min_effect: float
) -> tuple[dict[str, str], dict[str, float]]:
    """compare_sweeps' `disturbed` and `speeds` from each variant's conditions in both sweeps."""
    disturbed = {name: why for name in set(base) & set(cand) if (why := disturbance(base[name], cand[name], min_effect))}
    speeds = {name: speed for name in disturbed if (speed := speed_change(base[name], cand[name])) is not None}
    return disturbed, speeds
