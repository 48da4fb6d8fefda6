"""A captured call timed in its application's rhythm (tasks/measure/rhythm.py): each call after
a gap of busy Python, at every gap of the grid and the application's own; and ONNX Runtime's
spinning, which decides what such a gap costs it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tasks.measure import rhythm


def test_each_call_follows_its_gap_and_each_gap_is_a_point_of_the_series(monkeypatch):
    """The timer stub reports the time since the previous call returned: the gap itself."""
    monkeypatch.setattr(rhythm, "CALLS", 5)
    monkeypatch.setattr(rhythm, "MIN_CALLS", 5)
    last = [time.perf_counter_ns()]
    calls = []

    def timer(call) -> int:
        took = time.perf_counter_ns() - last[0]
        call()
        last[0] = time.perf_counter_ns()
        return took

    metrics, series = rhythm.in_rhythm([lambda: calls.append(1), lambda: calls.append(2)], 2.0, timer)
    gaps = [g for g, _ in series["rhythm_by_gap_ms_mean"]]
    assert gaps == [100, 300, 1000, 2000, 3000]  # the grid and the application's gap, in us
    assert len(calls) == 5 * len(gaps) and calls[:3] == [1, 2, 1]  # in turn
    for gap_us, ms in series["rhythm_by_gap_ms_median"]:
        assert ms >= gap_us / 1e3  # after its gap (how long after: this machine's load)
    assert metrics["rhythm_gap_ms"] == 2.0 and metrics["rhythm_calls"] == 5
    assert metrics["rhythm_latency_ms_median"] == pytest.approx(dict(series["rhythm_by_gap_ms_median"])[2000])


def test_a_long_call_stops_at_the_time_cap_after_the_fewest_calls(monkeypatch):
    monkeypatch.setattr(rhythm, "MIN_CALLS", 3)
    monkeypatch.setattr(rhythm, "MAX_SECONDS", 0.0)
    assert len(rhythm.paced([lambda: None], 0.0, lambda call: 1)) == 3


def test_a_step_on_a_growing_cache_alternates_with_its_previous_shape():
    feeds = {"input_ids": np.ones((1, 1), np.int64), "cache_position": np.array([5]),
             "past_key_values.0.key": np.arange(10.0).reshape(1, 1, 5, 2), "past_key_values.0.value": np.zeros((1, 1, 5, 2))}  # fmt: skip
    prev = rhythm.shorter(feeds)
    assert prev["cache_position"].tolist() == [4] and prev["past_key_values.0.key"].shape == (1, 1, 4, 2)
    assert prev["past_key_values.0.key"].tolist() == feeds["past_key_values.0.key"][:, :, :4].tolist()
    assert rhythm.shorter({"input_ids": feeds["input_ids"]}) is None  # a prompt: nothing to shorten


@pytest.mark.parametrize(("spinning", "entry"), [(True, "1"), (False, "0")])
def test_onnxruntimes_intra_op_spinning_is_a_backend_option(spinning, entry):
    """backend.options.intra_op_spinning: ONNX Runtime's threads spin after a run (its default) or park."""
    pytest.importorskip("onnxruntime")
    from tasks.runtimes.onnxruntime import Options, session_options

    opts = session_options(Options(intra_op_spinning=spinning), 2)
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == entry and opts.intra_op_num_threads == 2
