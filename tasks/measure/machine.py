"""The benchmark's cores and the machine's state around its timed window (stdlib only).

- `pin(threads)` (via `benchmark_cores`): in the benchmark's own process, before the runtime is loaded, pin every
  thread of the process to `threads` of the cores it may use, so the thread pools the
  runtime starts later (ONNX Runtime, XNNPACK, torch) inherit them. A CPU benchmark holds
  its whole node (orchestrator/plan/placement.py), so it takes the LAST cores of the allowed set:
  core 0 tends to take interrupts and housekeeping.
- `watch(cores)`: around the timed window, what pyperf records as system state: the
  frequency governor and current frequency of the bench cores, the load average before and
  after, and the share of the bench cores' time that OTHER processes took during the window
  (`other_cpu_fraction`), flagged as `shared_cores` above SHARED_THRESHOLD.

Nothing here fails a benchmark: what cannot be read (no cpufreq in a container, no
/proc/stat off Linux) is recorded as "unknown" or left out.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Other processes' share of the bench cores' time above which a run is flagged `shared_cores`;
# /proc/stat counts clock ticks, so windows under ~0.5 s per core can cross it on noise alone.
SHARED_THRESHOLD = 0.05

# /proc/stat per-cpu columns counted as busy: user nice system irq softirq steal
# (iowait and idle are not; guest time is already inside user)
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
_SYS_CPU = Path("/sys/devices/system/cpu")
UNKNOWN = "unknown"

_ALLOWED: tuple[int, ...] | None = None  # the process's cores before pin() narrowed them


def die_with_parent() -> None:
    """In a child process: be killed when the process that started it ends (Linux)."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def alive(pid: int) -> bool:
    """Whether process `pid` of this machine still runs (one of another user's counts; a
    zombie, ended but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] not in "ZX"
    except (OSError, ValueError, IndexError):  # no /proc (not Linux), or it ended meanwhile
        return True


# -- cores ------------------------------------------------------------------------------


def allowed_cores() -> list[int]:
    """The cores this process may use, as it was given them (before pin() narrowed them)."""
    if _ALLOWED is not None:
        return list(_ALLOWED)
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def choose_cores(allowed: Iterable[int], threads: int | None) -> list[int]:
    """The last `threads` of the allowed cores; all of them for None or more than there are."""
    cores = sorted(allowed)
    if not threads or threads >= len(cores):
        return cores
    return cores[-threads:]


def pin(threads: int | None) -> list[int]:
    """Pin every thread of this process to `threads` cores chosen by choose_cores(); the
    cores it runs on. Threads started afterwards inherit the affinity. Where pinning is not
    possible, nothing changes and all allowed cores are returned."""
    global _ALLOWED
    allowed = allowed_cores()
    _ALLOWED = tuple(allowed)
    cores = choose_cores(allowed, threads)
    try:
        os.sched_setaffinity(0, cores)
    except (AttributeError, OSError):
        return allowed
    for tid in _thread_ids():  # threads already started (e.g. a BLAS pool at numpy's import)
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # ended meanwhile
            pass
    return cores


def benchmark_cores(device: str, threads: int | None) -> list[int]:
    """The cores a benchmark runs on. A CPU benchmark in a process of its own (the child
    bench_in_fresh_process spawns) pins itself to `threads` of them; a caller's own process
    (a test or notebook calling bench_job directly) keeps its affinity, and a CUDA benchmark,
    which holds one GPU and not a node, is not pinned."""
    if device == "cpu" and multiprocessing.parent_process() is not None:
        return pin(threads)
    return allowed_cores()


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def core_list(cores: Iterable[int]) -> str:
    """Cores as Linux writes CPU lists: [0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cores)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


# -- CPU time on the bench cores: pure arithmetic on /proc/stat text ---------------------


def parse_proc_stat(text: str) -> dict[int, int]:
    """Busy jiffies (user+nice+system+irq+softirq+steal) per core from /proc/stat's text."""
    busy: dict[int, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = [int(v) for v in rest.split()]
        busy[int(name[3:])] = sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
    return busy


def busy_jiffies(busy: dict[int, int], cores: Iterable[int]) -> int | None:
    """Busy jiffies summed over `cores`; None when /proc/stat does not list one of them."""
    try:
        return sum(busy[c] for c in cores)
    except KeyError:
        return None


def other_cpu_fraction(
    busy_before: int, busy_after: int, own_seconds: float, wall_seconds: float, ncores: int, hz: int
) -> float:
    """Share of the cores' time over a window that processes other than this one took:
    (busy time on the cores - this process's CPU time) / (wall time x cores), in [0, 1]."""
    if wall_seconds <= 0 or ncores <= 0 or hz <= 0:
        return 0.0
    other = (busy_after - busy_before) / hz - own_seconds
    return min(1.0, max(0.0, other / (wall_seconds * ncores)))


# -- readings ----------------------------------------------------------------------------


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def governor(cores: Iterable[int]) -> str:
    """The cores' cpufreq governors ("performance", "powersave,performance"), or "unknown"."""
    found = {g.strip() for c in cores if (g := _read(_SYS_CPU / f"cpu{c}/cpufreq/scaling_governor"))}
    return ",".join(sorted(found)) if found else UNKNOWN


def cpu_mhz(cores: Iterable[int]) -> float | None:
    """Mean current frequency of the cores in MHz: cpufreq's scaling_cur_freq, else
    /proc/cpuinfo's "cpu MHz" (present in containers on x86); None when neither says."""
    cores = list(cores)
    khz = [int(v) for c in cores if (v := _read(_SYS_CPU / f"cpu{c}/cpufreq/scaling_cur_freq")) and v.strip().isdigit()]
    if khz:
        return sum(khz) / len(khz) / 1000
    mhz = _cpuinfo_mhz(_read("/proc/cpuinfo") or "")
    values = [mhz[c] for c in cores if c in mhz]
    return sum(values) / len(values) if values else None


def _cpuinfo_mhz(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    cpu = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        try:
            if key == "processor":
                cpu = int(value)
            elif key == "cpu MHz" and cpu is not None:
                out[cpu] = float(value)
        except ValueError:
            pass
    return out


def _own_cpu_seconds() -> float:
    """CPU time of this process, all its threads (not its children)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 100


@dataclass
class Snapshot:
    wall: float  # time.monotonic()
    own_cpu: float  # seconds, this process
    busy: int | None  # jiffies, the bench cores
    load_avg: float | None  # 1-minute
    mhz: float | None


def snapshot(cores: Iterable[int]) -> Snapshot:
    """The bench cores' state now. Never raises."""
    cores = list(cores)
    stat = _read("/proc/stat")
    try:
        mhz = cpu_mhz(cores)
    except (OSError, ValueError):
        mhz = None
    return Snapshot(
        wall=time.monotonic(),
        own_cpu=_own_cpu_seconds(),
        busy=busy_jiffies(parse_proc_stat(stat), cores) if stat else None,
        load_avg=_load_avg(),
        mhz=mhz,
    )


def window_state(before: Snapshot, after: Snapshot, cores: list[int], hz: int | None = None) -> tuple[dict, dict]:
    """(metrics, params) describing the window between two snapshots of `cores`."""
    metrics: dict[str, float] = {}
    params: dict[str, str] = {"cpu_governor": governor(cores)}
    for name, snap in (("before", before), ("after", after)):
        if snap.load_avg is not None:
            metrics[f"load_avg_{name}"] = snap.load_avg
        if snap.mhz is not None:
            metrics[f"cpu_mhz_{name}"] = snap.mhz
        else:
            params[f"cpu_mhz_{name}"] = UNKNOWN
    if before.busy is not None and after.busy is not None:
        frac = other_cpu_fraction(
            before.busy,
            after.busy,
            after.own_cpu - before.own_cpu,
            after.wall - before.wall,
            len(cores),
            hz or _clock_ticks(),
        )
        metrics["other_cpu_fraction"] = frac
        metrics["shared_cores"] = float(frac > SHARED_THRESHOLD)
    return metrics, params


@dataclass
class Window:
    cores: list[int]
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


@contextmanager
def watch(cores: Iterable[int]) -> Iterator[Window]:
    """Snapshot `cores` on entry and exit; the Window's metrics and params are filled on exit."""
    window = Window(list(cores))
    before = snapshot(window.cores)
    try:
        yield window
    finally:
        metrics, params = window_state(before, snapshot(window.cores), window.cores)
        window.metrics.update(metrics)
        window.params.update(params, niceness=str(os.getpriority(os.PRIO_PROCESS, 0)))  # above 0: the machine's other work comes first


def peak_rss_mb() -> float:
    """Peak resident memory of this process since start or the last reset_peak_rss()."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM, so the next peak is the timing's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
