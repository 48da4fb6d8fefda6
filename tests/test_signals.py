"""Ctrl-C and SIGTERM in the driver wait for a write to the tracking store in flight, and only
that (orchestrator.common.signals). CI once saw a Ctrl-C land inside MLflow's sqlite store: the abort
that closes every run then failed with "database is locked"."""

from __future__ import annotations

import signal

import pytest

from orchestrator.common import signals
from orchestrator.common.signals import Deferring, Terminated, deferred, installed
from orchestrator.plan.config import TrackingCfg
from orchestrator.record.store import Store
from orchestrator.record.tracking import Tracker


@pytest.fixture
def driver_handlers(default_sigint):
    with installed():
        yield


def test_a_signal_outside_a_write_is_raised_where_it_lands(driver_handlers):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(Terminated):
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.parametrize("sig, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_signal_inside_a_write_waits_for_the_outermost_write_to_end(driver_handlers, sig, raised):
    done = []
    with pytest.raises(raised):
        with deferred():
            with deferred():
                signal.raise_signal(sig)
                done.append("inner")
            done.append("outer")  # the inner write's end is not the outermost's
        done.append("after")  # never reached: raised as the outermost ends
    assert done == ["inner", "outer"]
    assert signals._pending == [] and signals._depth == 0


def test_an_exception_leaving_a_write_wins_over_a_signal_that_waited(driver_handlers):
    with pytest.raises(ValueError):
        with deferred():
            signal.raise_signal(signal.SIGINT)
            raise ValueError("the store refused")
    with deferred():  # the dropped signal is not raised later, in the abort's writes
        pass
    assert signals._pending == [] and signals._depth == 0


def test_the_previous_handlers_come_back_and_an_ignored_sigint_stays_ignored(default_sigint):
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with installed():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signals._handler
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    with installed():
        assert signal.getsignal(signal.SIGINT) is signals._handler
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_inside_a_store_write_lets_it_commit_and_the_abort_close_the_run(
    driver_handlers, tmp_path, mlflow_db, monkeypatch
):
    """On the real sqlite store: the Ctrl-C lands inside MLflow's transaction; the tags are
    committed, the KeyboardInterrupt comes after, and the abort's writes go through."""
    tracker = Tracker(Store.checked(TrackingCfg(uri=mlflow_db(tmp_path))))
    assert isinstance(tracker.client, Deferring)
    run_id = tracker.start_sweep("s", {}, {})
    store = tracker.client._target._tracking_client.store
    original = type(store)._set_tags

    def interrupted(self, run_id, tags):
        signal.raise_signal(signal.SIGINT)  # mid-transaction, as a user's Ctrl-C can land
        return original(self, run_id, tags)

    monkeypatch.setattr(type(store), "_set_tags", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tracker.log(run_id, tags={"status": "running"})
    monkeypatch.setattr(type(store), "_set_tags", original)
    assert tracker.client.get_run(run_id).data.tags["status"] == "running"  # the write the signal landed in
    tracker.log(run_id, tags={"status": "aborted"})
    tracker.end(run_id, "KILLED")
    run = tracker.client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["status"] == "aborted"
