"""The local Ray the driver starts: loopback only, one CPU benchmark per node at a time.

Only what needs a live Ray; the placement rules themselves are tested in test_placement.py."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.plan.config import ClusterCfg
from orchestrator.plan.placement import bench_request, export_request
from orchestrator.run import reaper
from orchestrator.run.scheduler import Scheduler

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


def _window():
    """A remote function that sleeps a second and returns (start, end)."""
    import ray

    @ray.remote(max_calls=1)
    def window(_spec, _timeout_s=None, _forks=None, _packed=None):
        start = time.time()
        time.sleep(1.0)
        return start, time.time()

    return window


def _export_window():
    """_window's, as an export task returns: (a result, its payload)."""
    import ray

    @ray.remote(max_calls=1)
    def window(_spec, _timeout_s=None, _forks=None, _ship=None):
        start = time.time()
        time.sleep(1.0)
        return SimpleNamespace(ok=True, span=(start, time.time())), None

    return window


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


def test_capacity_is_read_from_the_live_cluster(scheduler):
    sched, _ = scheduler
    assert sched.capacity.cpus == 2 and sched.capacity.bench_slots == 1 and sched.capacity.gpus == 0
    assert sched.capacity.total_cpus == 2 and sched.capacity.memory > 0


def test_two_cpu_benchmarks_never_overlap(scheduler):
    """Tasks with bench resources run one after the other even when both are ready."""
    sched, _ = scheduler
    cap = sched.capacity
    for i in range(2):
        request = bench_request(cap, "cpu", 1, {}, weight_bytes=0, memory_factor=1.5, max_retries=0)
        assert request.pool == "bench_cpu"
        sched.submit("bench", f"b{i}", None, request)
    sched._remote["bench"] = _window()  # the bench entry swapped for a function that reports when it ran
    done = [event for event in sched.results() if event[0] != "tick"]
    assert sorted((kind, key) for kind, key, _ in done) == [("bench", "b0"), ("bench", "b1")]
    spans = sorted(result for _, _, result in done)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]


def test_the_next_export_starts_before_an_exports_result_is_recorded_a_benchmark_only_after(scheduler, tmp_path):
    """When an export ends, the next queued export is handed to Ray before the driver records
    the result; a benchmark waits until the driver asks for more, so no recording runs beside it."""
    sched, _ = scheduler
    cap = sched.capacity
    for i in range(3):
        spec = SimpleNamespace(out_dir=str(tmp_path / f"e{i}"))  # no such cache entry: a task
        sched.submit("export", f"e{i}", spec, export_request(cap, {}, weight_bytes=0, memory_factor=1.5, max_retries=0))
    sched.submit("bench", "b", None, bench_request(cap, "cpu", 2, {}, weight_bytes=0, memory_factor=1.5, max_retries=0))
    sched._remote["export"], sched._remote["bench"] = _export_window(), _window()
    running_at = {}  # each export's key -> what ran when its result reached the caller
    for kind, key, _ in sched.results():
        if kind == "export":
            running_at[key] = {f"{t.kind}:{t.key}" for t in sched.running.values()}
    first, *_, last = running_at
    assert first in ("e0", "e1") and "export:e2" in running_at[first]
    assert "bench:b" not in running_at[last] and not sched.running and not sched.queue


def test_the_bench_resource_alone_keeps_cpu_benchmarks_apart(scheduler):
    """Handed to Ray together (no queue limit), two one-thread benchmarks on a two-CPU node
    still run one after the other: the node's single phasesweep_bench slot serialises them."""
    import ray

    request = bench_request(scheduler[0].capacity, "cpu", 1, {}, weight_bytes=0, memory_factor=1.5, max_retries=0)
    window = _window()
    spans = sorted(ray.get([window.options(**request.options).remote(None) for _ in range(2)], timeout=60))
    assert spans[0][1] <= spans[1][0]


def test_an_export_in_a_local_cache_is_read_by_the_driver_without_a_task(scheduler, planned_variant, cache_override):
    """A local Ray's driver shares its node's cache: an entry there, sealed and verified, is
    the export's result at once (a cache hit, on the driver's node), with no export task and
    no export server to start for it."""
    import ray

    from tasks.worker.forks import EXPORT_SERVER
    from tests.conftest import plan_jobs

    sched, _ = scheduler
    made, _ = planned_variant("model=llama", "phase=decode")  # made once a session in the shared cache
    plan = plan_jobs(["model=llama", "phase=decode", cache_override])
    (job,) = plan.exports.values()
    assert sched.own_local and sched.holds(job.spec)
    assert EXPORT_SERVER not in plan.fork_servers(lambda spec: not sched.holds(spec))
    assert EXPORT_SERVER in plan.fork_servers()
    sched.submit("export", "the-key", job.spec, job.request)
    assert not sched.queue and not sched.running  # nothing for Ray to run
    (event,) = [e for e in sched.results() if e[0] != "tick"]
    kind, key, result = event
    assert (kind, key) == ("export", "the-key") and result.ok and result.cache_hit
    assert result.out_dir == made.out_dir and result.artifact == made.artifact
    assert result.details["ray_node"] == ray.get_runtime_context().get_node_id()


def test_only_a_complete_verified_entry_is_a_cache_hit(planned_variant, tmp_path):
    """cached_export: a copy of a sealed entry is a hit; one file changed by a byte, or the
    manifest missing, is not (the export task rebuilds it)."""
    import shutil

    from tasks.worker.entries import MANIFEST, cached_export

    made, _ = planned_variant("model=llama", "phase=decode")
    spec = SimpleNamespace(key=made.key)
    good = shutil.copytree(made.out_dir, tmp_path / "good")
    assert cached_export(spec, good).cache_hit
    bad = shutil.copytree(made.out_dir, tmp_path / "bad")
    artifact = bad / Path(made.artifact).name
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF
    artifact.write_bytes(bytes(data))
    assert cached_export(spec, bad) is None
    unsealed = shutil.copytree(made.out_dir, tmp_path / "unsealed")
    (unsealed / MANIFEST).unlink()
    assert cached_export(spec, unsealed) is None
    assert cached_export(spec, tmp_path / "absent") is None


def test_the_local_rays_autoscaler_monitor_is_found_by_the_name_its_shutdown_ends_it_by(scheduler):
    """The one name of Ray's that the shutdown uses (reaper.AUTOSCALER_MONITOR): a renamed
    monitor fails here, by name, rather than every sweep waiting on it again unnoticed."""
    sched, _ = scheduler
    session = sched.watchdog.session
    (monitor,) = session.running(reaper.AUTOSCALER_MONITOR)
    assert sched.watchdog.end_autoscaler() == [monitor]
    deadline = time.monotonic() + 30
    while reaper.start_time(monitor) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reaper.start_time(monitor) is None
    assert session.live(), "the rest of the local Ray goes on"


def test_the_local_rays_raylet_is_found_by_the_name_its_shutdown_looks_for(scheduler):
    """reaper.RAYLET: while the raylet runs, the shutdown calls ray.shutdown(). A renamed raylet
    fails here, rather than every sweep taking its Ray for dead and skipping the shutdown."""
    sched, _ = scheduler
    assert len(sched.watchdog.session.running(reaper.RAYLET)) == 1
    assert not sched.watchdog.raylet_gone()


def test_ctrl_c_waits_for_the_local_rays_start_to_end(monkeypatch, default_sigint):
    """An interrupt inside ray.init can leave a driver core worker that no ray.shutdown reaches,
    whose thread crashes the interpreter's exit: it is raised once the start has returned, its
    watchdog kept for stop()."""
    import signal

    from orchestrator.common.signals import installed
    from orchestrator.run import ray_session

    def start(cluster, cap):
        signal.raise_signal(signal.SIGINT)  # to this thread: the handler has run when it returns
        return "its watchdog"

    monkeypatch.setattr(ray_session, "import_ray_on_loopback", lambda: SimpleNamespace(is_initialized=lambda: False))
    monkeypatch.setattr(ray_session, "start", start)
    sched = Scheduler(ClusterCfg())
    with installed(), pytest.raises(KeyboardInterrupt):
        sched._start()
    assert sched.watchdog == "its watchdog" and sched.owned


def test_sigterm_inside_rays_wait_leaves_as_terminated():
    """The driver's SIGTERM handler raises Terminated inside Ray's compiled wait, which hands it
    back as a SystemError: the scheduler's loop raises the Terminated itself."""
    from orchestrator.common.signals import Terminated
    from orchestrator.run.scheduler import _wait

    def wait(refs, num_returns, timeout):
        try:
            raise Terminated()
        except Terminated as e:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from e

    with pytest.raises(Terminated):
        _wait(SimpleNamespace(wait=wait), ["ref"])
    with pytest.raises(SystemError):  # any other SystemError is left as it is
        _wait(SimpleNamespace(wait=lambda *a, **k: (_ for _ in ()).throw(SystemError("other"))), ["ref"])
