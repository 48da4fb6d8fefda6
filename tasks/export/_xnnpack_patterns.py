"""XNNPACK's pattern graphs, made once by the export fork server before it forks (this module
is in tasks/export/executorch.py's PRELOAD): its lowering otherwise makes them in every export,
by exporting small modules into private functools caches. Guarded: on an executorch other
than PINNED, or where the caches have moved, it warns and does nothing (each export then
makes the patterns itself). The server stays one thread: torch runs single-threaded while
they are made, and the progress bar's monitor thread is ended."""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata

PINNED = "1.5.1"  # pyproject.toml's executorch
PACKAGE = "executorch.backends.xnnpack.partition.graphs"
CACHES = (("bilinear_2d", "_get_bilinear_2d_graphs"), ("sdpa", "get_graphs"))  # (module, its lru_cache)


def caches() -> list:
    """The cached functions to fill; raises what an upgrade broke (ImportError, AttributeError)."""
    found = []
    for module, name in CACHES:
        fn = getattr(importlib.import_module(f"{PACKAGE}.{module}"), name)
        if not hasattr(fn, "cache_info"):
            raise AttributeError(f"{PACKAGE}.{module}.{name} is no longer cached")
        found.append(fn)
    return found


def _end_tqdm_monitor() -> None:
    try:
        from tqdm import tqdm  # lazy: tqdm, only once the patterns are made
    except ImportError:
        return
    monitor = getattr(tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()  # stops and joins it; a later bar (in a child) starts its own
        tqdm.monitor = None


def make_patterns() -> bool:
    """Fill the caches; False, with a warning naming what was not found, where it cannot."""
    version = metadata.version("executorch")
    if version != PINNED:
        warnings.warn(f"executorch {version} is not {PINNED}: XNNPACK's patterns are made in each export", stacklevel=2)
        return False
    try:
        found = caches()
    except (ImportError, AttributeError) as e:
        warnings.warn(f"XNNPACK's pattern caches not found ({e}): they are made in each export", stacklevel=2)
        return False
    # lazy: torch, only in a job's process
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for fn in found:
            fn()
    finally:
        torch.set_num_threads(threads)
        _end_tqdm_monitor()
    return True


make_patterns()
