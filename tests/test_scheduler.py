"""The local Ray the driver starts: loopback only, one CPU benchmark per node at a time."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

from orchestrator.config import ClusterCfg, ConfigError
from orchestrator.scheduler import Scheduler

pytestmark = pytest.mark.slow


def _listening() -> set[tuple[str, int]]:
    """Every listening TCP socket on this machine, from /proc/net (no ss/psutil needed)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            addr_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(addr_hex)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return found


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "::ffff:127.0.0.1") or addr.startswith("::ffff:127.")


@pytest.fixture(scope="module")
def scheduler():
    before = _listening()
    sched = Scheduler(ClusterCfg(num_cpus=2))
    sched.start()
    yield sched, before
    sched.stop()


def test_local_ray_listens_on_loopback_only(scheduler):
    sched, before = scheduler
    time.sleep(2)  # agents open their ports shortly after init returns
    new = _listening() - before
    assert new, "Ray opened no listening socket at all?"
    exposed = sorted(a for a in new if not _loopback(a[0]))
    assert not exposed, f"Ray listens beyond loopback: {exposed}"


def test_cpu_benchmarks_take_a_whole_node(scheduler):
    sched, _ = scheduler
    assert sched.capacity.cpus == 2 and sched.capacity.bench_slots == 1
    opts, pool = sched.bench_options("cpu", sched.bench_threads("cpu", None), {})
    assert pool == "bench_cpu"
    assert opts["num_cpus"] == 2 and opts["resources"] == {"phasesweep_bench": 1}
    gpu, gpu_pool = sched.bench_options("cuda", 1, {"num_gpus": 1})
    assert gpu_pool == "bench_gpu" and gpu["num_gpus"] == 1 and "phasesweep_bench" not in gpu["resources"]
    with pytest.raises(ConfigError, match="bench.threads=8 exceeds the 2 CPUs"):
        sched.bench_options("cpu", 8, {})


def test_two_cpu_benchmarks_never_overlap(scheduler):
    """Tasks with bench resources run one after the other even when both are ready."""
    sched, _ = scheduler
    for i in range(2):
        sched.submit_bench(f"b{i}", None, sched.bench_options("cpu", 1, {})[0], "bench_cpu")
    # swap the bench entry for a function that reports when it ran
    import ray

    @ray.remote(max_calls=1)
    def window(_spec):
        start = time.time()
        time.sleep(1.0)
        return start, time.time()

    sched._bench = window
    spans = sorted(result for _, _, result in sched.results())
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]


def test_memory_requests_follow_model_size(scheduler):
    sched, _ = scheduler
    mem = sched.capacity.memory
    assert mem > 0
    assert "exceed the" in sched.placement_error("cpu", mem + 1)
    assert sched.placement_error("cpu", 10**6) is None
    assert sched.memory_warning(10**6, "onnx") is None
    assert "may not fit" in sched.memory_warning(mem // 2, "executorch")  # 4x the weights at peak
    opts, _ = sched.bench_options("cpu", 1, {}, weight_bytes=mem // 2)
    assert opts["memory"] == min(int(mem // 2 * 1.5), mem)
