"""What a sweep writes to a tracking server, kept on disk first: a server that goes away
(restarted, the network down) is waited for, and nothing measured meanwhile is lost.

Every write is appended to the journal (one JSON line, fsync'd) before it is sent, and its
number to the `.done` file once the server took it. While the server is unreachable the
write is retried with back-off up to `tracking.outage_s`; past that the sweep keeps writing
to the journal only and ends naming it, and `python -m orchestrator.replay JOURNAL` sends
what the server never took, in order. A replay sends each entry once: the `.done` file says
which were sent, so a second replay, or one after a driver killed mid-outage, sends the rest.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.common.console import say
from orchestrator.record.store import check_reachable

BACKOFF_S = (1, 2, 5, 10, 20, 30)  # waits between tries while the server is away, the last repeated


class ServerGone(Exception):
    """The tracking server did not come back within tracking.outage_s."""

    def __init__(self, journal: Path, uri: str, waited: float):
        self.journal, self.uri = journal, uri
        super().__init__(
            f"the tracking server {uri} was unreachable for {waited:.0f} s (tracking.outage_s); what it did not take "
            f"is kept in {journal}: once it is back, run  python -m orchestrator.replay {journal} --uri {uri}"
        )


class Journal:
    def __init__(self, path: Path, uri: str | None = None):
        self.path = path
        self.done_path = path.with_name(path.name + ".done")
        self.uri_path = path.with_name(path.name + ".uri")  # the server it was written for
        path.parent.mkdir(parents=True, exist_ok=True)
        if uri and not self.uri_path.is_file():
            self.uri_path.write_text(uri + "\n")
        self._lock = threading.Lock()
        self._next = sum(1 for _ in self.entries())

    def append(self, op: str, args: list[Any]) -> int:
        with self._lock:
            seq = self._next
            self._next += 1
            with self.path.open("a") as f:
                f.write(json.dumps({"seq": seq, "op": op, "args": args}, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return seq

    def mark(self, seq: int) -> None:
        with self._lock, self.done_path.open("a") as f:
            f.write(f"{seq}\n")
            f.flush()
            os.fsync(f.fileno())

    def entries(self) -> Iterator[dict[str, Any]]:
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError:  # a line cut short by a killed driver: never sent, never acknowledged
                        continue

    @property
    def uri(self) -> str | None:
        return self.uri_path.read_text().strip() if self.uri_path.is_file() else None

    def done(self) -> set[int]:
        if not self.done_path.is_file():
            return set()
        return {int(s) for s in self.done_path.read_text().split() if s.strip().isdigit()}

    def pending(self) -> list[dict[str, Any]]:
        done = self.done()
        return [e for e in self.entries() if e["seq"] not in done]


def is_outage(exc: BaseException, uri: str) -> bool:
    """Whether a failed write means the server is away (not reachable, or answering 5xx
    while it restarts), rather than refusing this write."""
    status = getattr(exc, "get_http_status_code", lambda: None)()
    if isinstance(status, int) and status >= 500:
        return True
    try:
        check_reachable(uri)
    except Exception:
        return True
    text = str(exc)
    return "Max retries exceeded" in text or "Connection refused" in text or "timed out" in text


class Sender:
    """Writes through the journal: each sent once the server takes it, waited for while it is away."""

    def __init__(
        self, journal: Journal, uri: str, outage_s: float, apply: Callable[[str, list[Any]], None], backoff: tuple = BACKOFF_S
    ):
        self.journal, self.uri, self.outage_s, self.apply, self.backoff = journal, uri, outage_s, apply, backoff
        self.gone: ServerGone | None = None  # past outage_s: from then on, the journal only
        self._lock = threading.Lock()

    def send(self, op: str, args: list[Any]) -> None:
        seq = self.journal.append(op, args)
        with self._lock:  # in order: a write waits for the one before it
            if self.gone is not None:  # the sweep is ending: what it closes goes to the journal only
                return
            started = None
            tries = 0
            while True:
                try:
                    self.apply(op, args)
                    break
                except Exception as e:
                    if not is_outage(e, self.uri):
                        raise
                    now = time.monotonic()
                    if started is None:
                        started = now
                        say(f"  tracking  server {self.uri} unreachable: waiting up to {self.outage_s:g} s; results kept in {self.journal.path}")
                    if now - started >= self.outage_s:
                        self.gone = ServerGone(self.journal.path, self.uri, now - started)
                        raise self.gone from None
                    time.sleep(min(self.backoff[min(tries, len(self.backoff) - 1)], max(0.0, self.outage_s - (now - started))))
                    tries += 1
            if started is not None:
                say(f"  tracking  server {self.uri} back after {time.monotonic() - started:.0f} s; nothing lost")
        self.journal.mark(seq)
