"""Python's cyclic garbage collector in processes that import a great deal and then work:
each full collection walks the million long-lived objects torch, transformers, MLflow or Ray
make, though none is garbage.

- `manage_process()`: this process is phasesweep's own (the driver, a fork server); a process
  that only calls into phasesweep (pytest, a notebook) keeps its collector as it is.
- `imports_uncollected()`: in a managed process, the collector is off while imports run, then
  what they made is frozen (gc.freeze), so a forked child's collections walk only its own objects.
- at exit, a managed process freezes its heap rather than walk it once more.

Stdlib only: a fork server imports this before anything heavy.
"""

from __future__ import annotations

import atexit
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_managed = False  # manage_process() was called
_depth = 0  # blocks now inside imports_uncollected, in any thread
_was_enabled = True  # the collector's state when the first of them began


def manage_process() -> None:
    """Mark this process as phasesweep's own; call it first, before libraries register exit
    handlers, so the final freeze runs after theirs. Once a process."""
    global _managed
    with _lock:
        if not _managed:
            atexit.register(gc.freeze)
            _managed = True


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
