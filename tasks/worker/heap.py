"""Python's cyclic garbage collector in processes that import a great deal and then work.

A process that imports torch, transformers, MLflow or Ray makes about a million long-lived
objects (an export fork server: 1.03 million). Each full collection walks them all, though
none is garbage. A heap that only grows starts one every time it grows by a quarter: an
export server's imports spend 1.5 s of their 7 s on them, a forked ONNX export 0.9 s of
its 3.3 s, the driver 1.1 s during its start-up and 1.5-1.8 s in the last collection, as
the interpreter exits (measured on this project's 2-core machine).

- `manage_process()`: this process is phasesweep's own (the driver sweep.py starts, a fork
  server), so the two below apply to it. A process that only calls into phasesweep (pytest,
  a notebook) keeps its collector as it is: freezing is process-wide, and frozen objects are
  invisible to gc.get_referrers and gc.get_objects, which debuggers and test tools use.
- `imports_uncollected()`: in a managed process, the collector is off while the imports run,
  then what they made is frozen (gc.freeze: moved where no collection looks) and the
  collector is back on. Python's own recipe for a server that forks without exec: a forked
  child's collections walk only its own objects, and leave the server's pages shared.
- at exit, after every other exit handler, a managed process freezes its heap, so the
  interpreter does not walk it once more only to free memory the OS takes back anyway.

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
    """Mark this process as phasesweep's own; call it first thing, before the process
    imports libraries that register exit handlers of their own (MLflow's flush of queued
    writes, Ray's shutdown): atexit runs handlers last-registered first, so the final
    freeze comes after them and before the interpreter's last collection. Finalizers of
    objects in reference cycles then do not run at exit; Python never promised that they
    would, and nothing of this project's relies on them (files are closed, runs ended, the
    store written before exit). Once a process: later calls do nothing."""
    global _managed
    with _lock:
        if not _managed:
            atexit.register(gc.freeze)
            _managed = True


@contextmanager
def imports_uncollected() -> Iterator[None]:
    """In a managed process, the block runs with the cyclic collector off; everything alive
    at its end is frozen (never collected, never walked: objects the block made to keep).
    The collector is then as it was. Blocks may nest and overlap across threads (the driver
    imports MLflow in one while Ray starts in another): the collector is off from the first
    one's start to the last one's end. For start-up blocks that import and keep: garbage in
    reference cycles not yet collected when the last block ends (the block's, or older) is
    frozen with the rest and stays allocated until the process ends, so nothing that loops
    over much data belongs in one. (A collection first would cost what the block saved:
    0.7 s after an export server's imports, which had left 21,000 unreachable objects.)
    Elsewhere the block just runs."""
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
