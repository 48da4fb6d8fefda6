"""XNNPACK's pattern graphs, built once by the export server before it forks (this module is
in tasks/export/executorch.py's PRELOAD: importing it does the work).

ExecuTorch's lowering to XNNPACK runs its passes on every delegated subgraph, and two of
them match patterns (bilinear upsampling, SDPA) whose graphs they make on first use, by
exporting small modules (cached with functools.lru_cache): about 3 s of CPU in every forked
export, each time anew. Made here once, every child inherits them; measured in forked
children: an ExecuTorch export of a tiny model 14.5-15.0 s -> 9.4-11.2 s, its .pte
byte-identical. The server still forks with its main thread alone and no OpenMP pool:
torch runs single-threaded while the patterns are made (its thread count is put back), and
the monitor thread of the progress bar that making them shows (tqdm's) is ended.
"""

from __future__ import annotations

import torch
from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa


def _end_tqdm_monitor() -> None:
    try:
        from tqdm import tqdm
    except ImportError:
        return
    monitor = getattr(tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()  # stops and joins it; a later bar (in a child) starts its own
        tqdm.monitor = None


def make_patterns() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bilinear_2d.get_graphs()
        sdpa.get_graphs()
    finally:
        torch.set_num_threads(threads)
        _end_tqdm_monitor()


make_patterns()
