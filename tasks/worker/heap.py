"""Python's cyclic garbage collector in processes that import a great deal and then work:
each full collection walks the million long-lived objects torch, transformers, MLflow or Ray
make, though none is garbage.

- `manage_process()`: this process is phasesweep's own (the driver, a fork server); a process
  that only calls into phasesweep (pytest, a notebook) keeps its collector as it is.
- `imports_uncollected()`: in a managed process, the collector is off while imports run, then
  what they made is frozen (gc.freeze), so a forked child's collections walk only its own objects.
- at exit, a managed process freezes its heap rather than walk it once more; one that said
  its work is done (`ending(status)`) runs its exit handlers, then ends without the
  interpreter's teardown (freeing the driver's heap object by object: a tenth of a second or more).

Stdlib only: a fork server imports this before anything heavy.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_managed = False  # manage_process() was called
_depth = 0  # blocks now inside imports_uncollected, in any thread
_was_enabled = True  # the collector's state when the first of them began
_status: int | None = None  # ending(): the status this process exits with, its work done


def manage_process() -> None:
    """Mark this process as phasesweep's own; call it first, before libraries register exit
    handlers, so the final freeze runs after theirs. Once a process."""
    global _managed
    with _lock:
        if not _managed:
            atexit.register(_at_exit)  # the first registered: it runs after every other exit handler
            _managed = True


def ending(code: object) -> None:
    """A managed process's work is done and it exits with sys.exit's `code` (None: 0, a
    message: 1): after its exit handlers it ends with that status, skipping the teardown."""
    global _status
    if _managed:
        _status = code if isinstance(code, int) else (0 if code is None else 1)


def _at_exit() -> None:
    gc.freeze()
    if _status is not None:  # every exit handler ran: what is left is freeing memory the OS frees anyway
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or its reader gone
                pass
        os._exit(_status)


@contextmanager
def imports_uncollected() -> Iterator[None]:
    """In a managed process, the block runs with the collector off and what is alive at its end
    is frozen; blocks may nest and overlap across threads. For start-up imports only: garbage
    left in cycles is frozen with the rest. Elsewhere the block just runs."""
    global _depth, _was_enabled
    if not _managed:
        yield
        return
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.freeze()
                if _was_enabled:
                    gc.enable()
