"""The benchmark's cores and the machine's state around its timed window (tasks/measure/machine.py).

The arithmetic is tested on injected /proc/stat text; the live tests pin in a child process
(never this one) and use an event, not a timing guess, for the busy neighbour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tasks.measure import machine
from tasks.measure.machine import (
    SHARED_THRESHOLD,
    Snapshot,
    busy_jiffies,
    choose_cores,
    core_list,
    other_cpu_fraction,
    parse_proc_stat,
    window_state,
)
from tests.conftest import ROOT

linux_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")

STAT = """cpu  254052 50149 34300 65932 1314 0 570 1973 0 0
cpu0 117001 24092 16330 45035 513 0 139 987 0 0
cpu1 137051 26057 17969 20896 801 3 431 986 0 0
intr 123456 0 0
ctxt 98765
"""


# -- pure -------------------------------------------------------------------------------


def test_parse_proc_stat_sums_the_busy_columns_per_core():
    busy = parse_proc_stat(STAT)
    assert set(busy) == {0, 1}  # the aggregate "cpu" line and other lines are not cores
    assert busy[0] == 117001 + 24092 + 16330 + 0 + 139 + 987  # user nice system irq softirq steal
    assert busy[1] == 137051 + 26057 + 17969 + 3 + 431 + 986  # idle and iowait not counted
    assert busy_jiffies(busy, [0, 1]) == busy[0] + busy[1]
    assert busy_jiffies(busy, [1]) == busy[1]
    assert busy_jiffies(busy, [7]) is None  # a core /proc/stat does not list: unknown, not 0


def test_other_cpu_fraction_subtracts_this_process():
    # 1 s window on 2 cores at 100 Hz: 200 jiffies of capacity
    assert other_cpu_fraction(1000, 1100, own_seconds=1.0, wall_seconds=1.0, ncores=2, hz=100) == 0.0
    assert other_cpu_fraction(1000, 1150, own_seconds=1.0, wall_seconds=1.0, ncores=2, hz=100) == 0.25
    assert other_cpu_fraction(0, 50, own_seconds=0.0, wall_seconds=0.5, ncores=1, hz=100) == 1.0
    # clamped: tick sampling can put the busy count a little under this process's own time, or over the window
    assert other_cpu_fraction(0, 90, own_seconds=1.0, wall_seconds=1.0, ncores=1, hz=100) == 0.0
    assert other_cpu_fraction(0, 500, own_seconds=0.0, wall_seconds=1.0, ncores=1, hz=100) == 1.0
    assert other_cpu_fraction(0, 10, own_seconds=0.0, wall_seconds=0.0, ncores=1, hz=100) == 0.0  # no window


def test_window_state_from_two_readings():
    before_text = STAT
    after_text = STAT.replace("cpu1 137051", "cpu1 137151")  # core 1: 100 jiffies more user time
    b = busy_jiffies(parse_proc_stat(before_text), [1])
    a = busy_jiffies(parse_proc_stat(after_text), [1])
    before = Snapshot(wall=10.0, own_cpu=2.0, busy=b, load_avg=0.5, mhz=2400.0)
    after = Snapshot(wall=12.0, own_cpu=2.92, busy=a, load_avg=1.25, mhz=None)
    metrics, params = window_state(before, after, [1], hz=100)
    # 1.0 s busy - 0.92 s own over 2.0 s x 1 core
    assert metrics["other_cpu_fraction"] == pytest.approx(0.04)
    assert metrics["shared_cores"] == 0.0  # under the threshold
    assert metrics["load_avg_before"] == 0.5 and metrics["load_avg_after"] == 1.25
    assert metrics["cpu_mhz_before"] == 2400.0 and "cpu_mhz_after" not in metrics
    assert params["cpu_mhz_after"] == "unknown" and "cpu_governor" in params
    busier = Snapshot(wall=12.0, own_cpu=2.5, busy=a, load_avg=1.0, mhz=2400.0)
    metrics, _ = window_state(before, busier, [1], hz=100)
    assert metrics["other_cpu_fraction"] == pytest.approx(0.25) and metrics["shared_cores"] == 1.0
    unknown = Snapshot(wall=12.0, own_cpu=2.5, busy=None, load_avg=None, mhz=None)
    metrics, _ = window_state(before, unknown, [1], hz=100)  # no /proc/stat: left out, never a made-up 0
    assert "other_cpu_fraction" not in metrics and "shared_cores" not in metrics and "load_avg_after" not in metrics


def test_choose_cores_takes_the_last_ones():
    assert choose_cores({0, 1, 2, 3}, 1) == [3]  # core 0 takes interrupts and housekeeping
    assert choose_cores([5, 2, 9], 2) == [5, 9]
    assert choose_cores([0, 1], 2) == [0, 1]
    assert choose_cores([0, 1], 8) == [0, 1]  # more threads than cores: all of them
    assert choose_cores([0, 1, 2], None) == [0, 1, 2]


def test_core_list():
    assert core_list([1]) == "1"
    assert core_list([0, 1]) == "0-1"
    assert core_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert core_list([]) == ""


def test_governor_and_frequency_never_fail(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "_SYS_CPU", tmp_path)  # a container: no cpufreq
    assert machine.governor([0]) == "unknown"
    (tmp_path / "cpu3/cpufreq").mkdir(parents=True)
    (tmp_path / "cpu3/cpufreq/scaling_governor").write_text("performance\n")
    (tmp_path / "cpu3/cpufreq/scaling_cur_freq").write_text("3000000\n")  # kHz
    assert machine.governor([3]) == "performance"
    assert machine.cpu_mhz([3]) == 3000.0
    assert machine._cpuinfo_mhz("processor\t: 0\ncpu MHz\t\t: 2445.406\n\nprocessor\t: 1\ncpu MHz\t: 1200\n") == {
        0: 2445.406,
        1: 1200.0,
    }


# -- live -------------------------------------------------------------------------------

PIN = """
import json, os, threading
from tasks.measure.machine import allowed_cores, pin
started = threading.Event(); done = threading.Event()
def idle():
    started.set(); done.wait()
t = threading.Thread(target=idle); t.start(); started.wait()  # a thread that exists before pinning
before = sorted(os.sched_getaffinity(0))
cores = pin(1)
out = dict(before=before, cores=cores, after=sorted(os.sched_getaffinity(0)),
           older_thread=sorted(os.sched_getaffinity(t.native_id)), allowed=allowed_cores())
done.set(); t.join()
print(json.dumps(out))
"""


@linux_affinity
def test_pin_one_thread_pins_the_process_to_one_allowed_core():
    """In a child process: pinning this test process would outlive the test."""
    proc = subprocess.run([sys.executable, "-c", PIN], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["cores"]) == 1 and out["cores"][0] in out["before"]
    assert out["cores"] == [out["before"][-1]]  # the last allowed core
    assert out["after"] == out["cores"]
    assert out["older_thread"] == out["cores"]  # threads started before pin() are pinned too
    assert out["allowed"] == out["before"]  # what the process was given, for the fingerprint


def test_benchmark_cores_leave_a_callers_own_process_alone():
    before = machine.allowed_cores()
    assert machine.benchmark_cores("cpu", 1) == before  # not a spawned benchmark process: not pinned
    assert machine.benchmark_cores("cuda", 1) == before
    if hasattr(os, "sched_getaffinity"):
        assert sorted(os.sched_getaffinity(0)) == before


def test_live_window_reads_numbers_without_failing():
    cores = machine.allowed_cores()[-1:]
    with machine.watch(cores) as window:
        time.sleep(0.05)
    m = window.metrics
    if os.path.exists("/proc/stat"):
        assert 0.0 <= m["other_cpu_fraction"] <= 1.0
        assert m["shared_cores"] in (0.0, 1.0)
        assert m["load_avg_before"] >= 0 and m["load_avg_after"] >= 0
    assert window.params["cpu_governor"]  # a governor or "unknown"
    assert window.params["niceness"] == str(os.getpriority(os.PRIO_PROCESS, 0))
    assert ("cpu_mhz_after" in m) != ("cpu_mhz_after" in window.params)


SPIN = """
import os, sys
os.sched_setaffinity(0, [int(sys.argv[1])])
print("running", flush=True)
while True:
    pass
"""


@linux_affinity
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat")
def test_a_busy_neighbour_on_the_bench_core_is_seen():
    core = machine.allowed_cores()[-1]
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(core)], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline().strip() == "running"  # pinned and spinning: the event
        with machine.watch([core]) as window:
            time.sleep(0.5)  # this process sleeps: the core's busy time is the neighbour's
    finally:
        spinner.kill()
        spinner.wait()
    assert window.metrics["other_cpu_fraction"] > 0.3
    assert window.metrics["shared_cores"] == 1.0 and SHARED_THRESHOLD < 0.3
