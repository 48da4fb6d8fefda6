"""Ctrl-C and SIGTERM in the driver: raised at once, except inside a write to the tracking
store (`deferred()`), where they wait for the outermost write to end: an interrupt inside
MLflow's sqlite store can leave a transaction open and the store locked. Main thread only."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Terminated(BaseException):
    """SIGTERM, raised in the driver's main thread: unwinds like Ctrl-C, so every exit path
    closes what it opened."""


_depth = 0  # nesting of deferred() in the main thread
_pending: list[int] = []  # signals that arrived inside it, in order


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt()


def _handler(signum: int, frame: object) -> None:
    if _depth:
        _pending.append(signum)
    else:
        _raise(signum)


@contextmanager
def installed() -> Iterator[None]:
    """The driver's handlers for SIGINT and SIGTERM while the sweep runs; the previous ones after.
    A SIGINT that is ignored (a shell's background job) stays ignored."""
    keep_int = signal.getsignal(signal.SIGINT)
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _handler)}
    if keep_int is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        _pending.clear()
        for sig, h in previous.items():
            signal.signal(sig, h)


@contextmanager
def deferred() -> Iterator[None]:
    """A signal arriving inside waits until the outermost deferred() ends; it is then raised,
    unless an exception is already leaving (that one unwinds to the same exit path)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    except BaseException:
        _depth -= 1
        if not _depth:
            _pending.clear()
        raise
    _depth -= 1
    if not _depth and _pending:
        signum = _pending.pop(0)
        _pending.clear()
        _raise(signum)


class Deferring:
    """A proxy of an object (MLflow's client) whose method calls each run inside deferred()."""

    def __init__(self, target: Any):
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with deferred():
                return attr(*args, **kwargs)

        return call
