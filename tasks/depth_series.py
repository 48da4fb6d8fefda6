"""A phase's series measured from the one export after its headline call (decode's
phase.depths): at each step the data the export stored (tasks/worker/entries.py SERIES) is
checked against its reference, then timed by the same loop and settings as the headline,
in the same process and session. Each figure becomes a series of (step, value) in
BenchResult.series, recorded as MLflow step metrics; the headline's own figures are the
series' point at its context_len, so the series is whole without timing that call twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.measure.bench import bench_metrics, measure
from tasks.measure.parity import failure_text, quantized, tolerance
from tasks.specs import BenchResult, BenchSpec, Failure
from tasks.worker.entries import load_series

PREFIX = "depth_"  # series metrics are the headline's names with this prefix, step = the cache depth
# the figures a series keeps at each step (headline metric names)
FIGURES = (
    "latency_ms_median",
    "latency_ms_median_ci_low",
    "latency_ms_median_ci_high",
    "latency_ms_p90",
    "latency_iqr_rel",
    "tokens_per_s",
    "tokens_per_s_per_sequence",
    "achieved_bandwidth_gbs",
    "bandwidth_share",
    "decode_bytes_per_step",
    "parity_max_abs_diff",
    "unstable",
)


def measure_series(
    spec: BenchSpec,
    phase: Any,
    session: Any,
    result: BenchResult,
    extras: Callable[[dict[str, np.ndarray], float], dict[str, float]],
) -> None:
    """Every step of phase.series(spec.phase) into result.series, with the headline's figures at
    its own step; a step whose parity fails fails the variant (result.failure, stage parity)."""
    points = {spec.phase.context_len: result.metrics}
    atol = tolerance(spec.model.dtype, spec.bench.parity_atol)
    for step in phase.series(spec.phase):
        feeds, parity = load_series(spec.export_dir, step)
        par = phase.check_parity(session, spec.phase, feeds, parity, atol)
        if spec.model.quant != "none":
            par = quantized(par, spec.model.quant)
        if not par["passed"]:
            result.failure = Failure("parity", f"at depth {step}: {failure_text(par, spec.model.quant)}")
            return
        points[step] = _timed(spec, session, feeds, extras) | {"parity_max_abs_diff": par["max_abs_diff"]}
    result.series = {
        PREFIX + key: [(step, float(m[key])) for step, m in sorted(points.items()) if key in m] for key in FIGURES
    }
    result.series = {k: v for k, v in result.series.items() if v}


def _timed(
    spec: BenchSpec, session: Any, feeds: dict[str, np.ndarray], extras: Callable[[dict[str, np.ndarray], float], dict[str, float]]
) -> dict[str, float]:
    """One step's call timed as the headline's was (bench options, timed region), with the phase's own metrics."""
    call = session.bind(feeds)
    with session.timed_region():
        m = measure(call, spec.bench, session.sync, session.timer())
    stats = bench_metrics(m, spec.bench)
    tokens = spec.phase.batch / (stats["latency_ms_median"] / 1e3)  # decode: one token per sequence a call
    figures = {**stats, "tokens_per_s": tokens, "tokens_per_s_per_sequence": tokens / spec.phase.batch}
    return figures | extras(feeds, stats["latency_ms_median"])
