"""Writes to a tracking server that goes away (orchestrator/record/journal.py): waited for,
kept on disk, and replayed once (python -m orchestrator.replay)."""

from __future__ import annotations

import socket

import pytest

from orchestrator.record.journal import Journal, Sender, ServerGone


def away() -> str:
    """A server address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def failing(times: int, sent: list):
    def apply(op, args):
        if len(sent) < times and not sent.append(None):  # the first `times` tries: the server is away
            raise ConnectionError("Connection refused")
        sent.append((op, args))

    return apply


def test_a_write_waits_for_the_server_and_is_sent_once(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="phasesweep")
    sent: list = []
    journal = Journal(tmp_path / "j.jsonl", "http://x")
    sender = Sender(journal, away(), outage_s=30, apply=failing(3, sent), backoff=(0.01,))
    sender.send("end", ["run1", "FINISHED"])
    assert [s for s in sent if s] == [("end", ["run1", "FINISHED"])]
    assert journal.pending() == [] and journal.done() == {0}
    out = caplog.text
    assert "unreachable: waiting up to 30 s" in out and "back after" in out and str(journal.path) in out


def test_a_server_that_never_returns_ends_naming_the_journal(tmp_path):
    sent: list = []
    uri = away()
    journal = Journal(tmp_path / "j.jsonl", uri)
    sender = Sender(journal, uri, outage_s=0.2, apply=failing(10**6, sent), backoff=(0.05,))
    with pytest.raises(ServerGone) as gone:
        sender.send("log", ["run1", [["m", 1.0, 1]], [], []])
    assert str(journal.path) in str(gone.value) and f"python -m orchestrator.replay {journal.path}" in str(gone.value)
    sender.send("end", ["run1", "KILLED"])  # the sweep closing its runs: to the journal only, at once
    assert [e["op"] for e in journal.pending()] == ["log", "end"]


def test_the_replay_sends_each_entry_once(tmp_path, capsys):
    """A journal written while a server was away, replayed into a store (a local one here):
    every entry lands, in order; a second replay sends nothing."""
    from mlflow.tracking import MlflowClient

    from orchestrator.replay import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("e", artifact_location=str(tmp_path / "art"))).info.run_id
    journal = Journal(tmp_path / "j.jsonl", uri)
    journal.append("log", [run, [["first_call_ms", 9.0, 1000]], [], []])
    journal.append("log", [run, [["latency_ms_median", 1.5, 1000]], [["p", "v"]], [["status", "ok"]]])
    journal.append("text", [run, "hello", "note.txt"])
    journal.append("end", [run, "FINISHED"])
    journal.mark(0)  # the server took the first write before it went away
    assert main([str(journal.path)]) == 0
    got = client.get_run(run)
    assert got.info.status == "FINISHED" and got.data.tags["status"] == "ok" and got.data.params["p"] == "v"
    assert "first_call_ms" not in got.data.metrics  # taken before the outage (by the server): not sent again
    assert "note.txt" in {a.path for a in client.list_artifacts(run)}
    assert main([str(journal.path)]) == 0
    assert "nothing to send" in capsys.readouterr().out
    assert len(client.get_metric_history(run, "latency_ms_median")) == 1  # sent once
