"""The machine's own memory bandwidth, the roofline decode on a CPU is held to.

A STREAM-like probe: `threads` threads (the benchmark's count, on the cores the benchmark
process is pinned to, which they inherit) each read (a sum) and copy their own share of
arrays much larger than the last-level cache; the best of REPEATS passes, in GB/s. Copy
counts the bytes read and written (STREAM's convention). numpy releases the GIL in both
loops, so the threads run in parallel. Measured once per machine fingerprint and thread
count, then read from a small JSON file in this user's cache (environment.user_cache()).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tasks.measure.environment import cpu_model, user_cache

MIN_BYTES = 64 << 20  # each array at least this large ...
LLC_MULTIPLE = 4  # ... and at least 4x the last-level cache (STREAM's rule)
REPEATS = 5  # passes of each kernel; the best one counts
FOLDER = "bandwidth"  # under the user's cache: one file per machine fingerprint and thread count


def last_level_cache_bytes() -> int:
    """The largest CPU cache sysfs lists for cpu0 (0 where it lists none)."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG") or 0) * scale)
    return max(sizes, default=0)


def probe(threads: int, repeats: int = REPEATS) -> dict[str, float]:
    """Read and copy bandwidth of `threads` threads, GB/s (best pass), and the bytes each pass moved."""
    total = max(MIN_BYTES, LLC_MULTIPLE * last_level_cache_bytes())
    n = total // 8 // threads * threads  # float64 elements, a whole share per thread
    src, dst = np.empty(n), np.empty(n)
    shares = [slice(i * n // threads, (i + 1) * n // threads) for i in range(threads)]

    def timed(kernel, repeats: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(kernel, shares))
            best = min(best, time.perf_counter() - t0)
        return best

    with ThreadPoolExecutor(threads) as pool:
        # every page mapped before timing, each thread its own share (a first touch is slow, and slower alone)
        timed(lambda s: (src[s].fill(1.0), dst[s].fill(0.0)), 1)
        read = timed(lambda s: src[s].sum(), repeats)
        copy = timed(lambda s: np.copyto(dst[s], src[s]), repeats)
    return {"read_gbs": n * 8 / read / 1e9, "copy_gbs": 2 * n * 8 / copy / 1e9, "probe_bytes": float(n * 8)}


def machine_key(threads: int) -> dict[str, str]:
    """What the bandwidth is measured for: the machine's fingerprint and the thread count."""
    return {
        "host": os.uname().nodename,
        "cpu_model": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "threads": str(threads),
    }


def machine_bandwidth(threads: int, cache_dir: str | Path | None = None) -> dict[str, float]:
    """probe(threads) for this machine, measured the first time and read from the cache
    (`cache_dir`, else the user's) after."""
    key = machine_key(threads)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir or user_cache()) / FOLDER / f"{digest}.json"
    try:
        return json.loads(path.read_text())["bandwidth"]
    except (OSError, ValueError, KeyError):
        pass
    figures = probe(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"machine": key, "bandwidth": figures}, indent=1))
    os.replace(tmp, path)  # another benchmark measuring at once writes the same figures
    return figures
