"""The task queue: hands Ray only what can start now (a task's clock runs from its hand-over,
worker start-up included), in random benchmark order; timeouts, retries, results.

What each task asks Ray for is decided when the plan is made (orchestrator/plan/placement.py).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.common.ray_env import root_cause
from orchestrator.common.signals import Terminated, deferred
from orchestrator.plan.config import ClusterCfg
from orchestrator.plan.placement import Capacity, Request, capacity_of
from orchestrator.run import entries, ray_session
from orchestrator.run.fork_hosts import ForkServers
from tasks.specs import Failure
from tasks.worker.entries import MANIFEST, cached_export
from tasks.worker.heap import imports_uncollected
from tasks.worker.transfer import localise, node_entry

log = logging.getLogger("phasesweep")

STAGES = {"export": "export", "bench": "benchmark", "capture": "capture", "pair": "benchmark", "remeasure": "benchmark", "apploop": "benchmark"}  # task kind -> a Failure's stage
# Ray errors after which a task runs again (up to cluster.max_retries): its process or node went away
RETRIABLE = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "ActorDiedError")
# the driver's backstop beyond cluster.task_timeout_s (which the task's process enforces): a worker's start-up
STARTUP_GRACE_S = 120.0


OBJECT_STORE_SHARE = 0.3  # Ray's default object store: 30% of available memory, the rest is its "memory"


def local_capacity(num_cpus: int | None = None) -> Capacity:
    """This machine as a local Ray started by the scheduler would offer it, without starting
    one (a dry run): cluster.num_cpus or every core, one bench slot, the NVIDIA GPUs it sees
    (CUDA_VISIBLE_DEVICES honoured), and Ray's default task memory (available memory less
    its object store). An estimate: Ray measures memory when it starts."""
    cpus = num_cpus or os.cpu_count() or 1
    gpus = sum(1 for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = min(gpus, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    try:
        meminfo = Path("/proc/meminfo").read_text()
        available = int(re.search(r"MemAvailable:\s+(\d+) kB", meminfo).group(1)) * 1024
    except (OSError, AttributeError):
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    memory = int(available * (1 - OBJECT_STORE_SHARE))
    return Capacity(cpus=cpus, total_cpus=cpus, bench_slots=1, gpus=gpus, memory=memory)


@contextmanager
def beside(fn: Any, *args: Any) -> Iterator[None]:
    """fn(*args) in a thread of its own while the block runs; its exception raised after the
    block, which waits for it even when the block raised (a Ctrl-C during Ray's start still
    finds the plan's runs whole, and closes them)."""
    failed: list[BaseException] = []

    def call() -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            failed.append(e)

    thread = threading.Thread(target=call, name=getattr(fn, "__name__", "beside"), daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if failed:
        raise failed[0]


@dataclass
class _Task:
    kind: str  # "export" | "bench" | "capture"
    key: str  # export key, variant name or capture key
    spec: Any
    request: Request
    ref: Any = None
    payload: Any = None  # an export's packed entry (a second object ref), when shipped
    started: float = 0.0
    attempts: int = 0


def _wait(ray: Any, refs: list[Any]) -> list[Any]:
    """The refs of `refs` that are done, waiting up to a second for one. SIGTERM's Terminated,
    raised by the driver's handler inside Ray's compiled wait, comes out of it as a SystemError
    ("returned a result with an exception set"): it leaves as itself."""
    try:
        return ray.wait(refs, num_returns=1, timeout=1.0)[0]
    except SystemError as e:
        if isinstance(e.__cause__, Terminated):
            raise e.__cause__ from None
        raise


class Scheduler:
    def __init__(self, cluster: ClusterCfg, seed: int | None = None, forks: ForkServers | None = None):
        """`forks`: the sweep's fork servers when some began before the plan (ForkServers.warm)."""
        self.cluster = cluster
        # benchmarks start in random order (Google Benchmark's random interleaving): a variant's
        # repeats are spread across the sweep, not run back to back
        self.seed = seed if seed is not None else random.randrange(2**31)
        self.rng = random.Random(self.seed)
        self.owned = False  # this driver started or joined Ray: it shuts it down
        self.watchdog: Any = None  # orchestrator.run.reaper.Watchdog of the local Ray this driver started
        self.queue: deque[_Task] = deque()
        self.running: dict[Any, _Task] = {}
        self.done: deque[tuple[str, str, Any]] = deque()  # results known without a task (exports in the cache)
        # a joined cluster's nodes need not share a filesystem: exports travel through Ray's
        # object store; a local Ray's tasks and driver share this machine's cache
        self.ship = cluster.address is not None
        self.payloads: dict[str, Any] = {}  # export cache entry (as planned) -> its packed entry's ref
        self._readers: dict[str, int] = {}  # export cache entry -> benchmarks queued or running on it
        self._fetched: Path | None = None  # where the driver unpacks what it logs
        self.forks = forks or ForkServers()
        self._node = ""  # the driver's node, once Ray runs
        # a local Ray offers what this machine does, measured now: the plan is made before Ray
        # starts, and Ray starts beside the fork servers' imports; a joined Ray's is read once joined
        already = sys.modules.get("ray")
        self.own_local = cluster.address is None and not (already is not None and already.is_initialized())
        self.capacity: Capacity | None = local_capacity(cluster.num_cpus) if self.own_local else None
        self._started = False

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        """Start a local Ray, or join the cluster (once; later calls return)."""
        if self._started:
            return
        self._started = True
        with imports_uncollected():  # Ray's import and start make objects to keep (tasks/worker/heap.py)
            self._start()

    def _start(self) -> None:
        if self.cluster.address is None:
            ray = ray_session.import_ray_on_loopback()
        else:
            import ray  # lazy: ray, only once a run starts
        if not ray.is_initialized():
            cap = self.capacity or local_capacity(self.cluster.num_cpus)
            # Ctrl-C waits for ray.init: interrupted, it can leave a driver core worker that no
            # ray.shutdown reaches, whose IO thread then crashes the interpreter's exit (SIGSEGV)
            with deferred():
                self.watchdog = ray_session.start(self.cluster, cap)
                self.owned = True
        self._remote = {
            "export": ray.remote(entries.export_entry),
            "bench": ray.remote(entries.bench_entry),
            "capture": ray.remote(max_calls=1)(entries.capture_entry),  # in a worker that ends after it
            "pair": ray.remote(entries.pair_entry),
            "apploop": ray.remote(max_calls=1)(entries.app_loop_entry),  # a captured application on a runtime
            "remeasure": ray.remote(entries.remeasure_entry),
        }
        self._node = entries.node_id()
        live = self._capacity()
        if self.capacity is None or not self.owned:
            self.capacity = live
        elif (live.cpus, live.gpus, live.bench_slots) != (self.capacity.cpus, self.capacity.gpus, self.capacity.bench_slots):
            raise RuntimeError(f"the local Ray offers {live}, not the capacity it was started with and planned on: {self.capacity}")

    def start_fork_servers(self, servers: dict[str, tuple[str, ...]]) -> None:
        """The fork servers (role -> what it imports) on every node, importing while the driver
        records the plan; the first task handed to Ray waits for each node's export server."""
        if not self.cluster.fork_server or self.forks.started:
            return
        if self.own_local:  # this machine's, the driver's children, before Ray starts or beside it
            self.forks.start_local(servers)
            return
        self.start()
        self.forks.start_on_nodes(servers)

    def holds(self, spec: Any) -> bool:
        """Whether the export is in a local Ray's cache, sealed (submit() verifies it): then
        no export server is needed for it."""
        if not self.own_local:
            return False
        return (Path(node_entry(spec.out_dir)) / MANIFEST).is_file()

    def stop(self) -> None:
        try:
            if self.owned or self.watchdog is not None:
                watchdog, self.watchdog = self.watchdog, None
                ray_session.shutdown(watchdog)
                self.owned = False
        finally:
            self.forks.stop()
            if self._fetched is not None:
                shutil.rmtree(self._fetched, ignore_errors=True)
                self._fetched = None
            self.payloads.clear()

    @contextmanager
    def stopping(self) -> Iterator[None]:
        """stop() in a thread of its own while the block runs (Ray's shutdown is mostly
        waiting); the driver's signal handlers installed again here, in the main thread."""
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            with beside(self.stop):
                yield
        finally:
            ray_session.restore_handlers(handlers)

    def export_folder(self, planned: str, made: str) -> Path:
        """A folder on the driver's machine holding the export the plan calls `planned`: the
        entry where its task `made` it on a local Ray (this machine), else a copy unpacked
        from what the export task sent."""
        packed = self.payloads.get(planned)
        if packed is None:
            return Path(made)
        import ray  # lazy: ray, only once a run starts

        if self._fetched is None:
            self._fetched = Path(tempfile.mkdtemp(prefix="phasesweep-exports-"))
        folder = self._fetched / Path(planned).name
        localise(folder, ray.get(packed))
        return folder

    def _capacity(self) -> Capacity:
        import ray  # lazy: ray, only once a run starts

        return capacity_of(ray.nodes(), self.cluster.address)

    # -- running ---------------------------------------------------------------------
    def submit(self, kind: str, key: str, spec: Any, request: Request) -> None:
        """Queue an export (key: its export key), a benchmark (key: the variant's name) or a
        capture (key: its capture key). An export a local Ray's cache holds, complete and
        verified, is a result at once: no task (nor an export server) is needed to read it."""
        if kind == "export" and self.own_local:
            hit = cached_export(spec, node_entry(spec.out_dir))
            if hit is not None:
                hit.details["ray_node"] = self._node
                self.done.append((kind, key, hit))
                return
        if kind == "bench" and self.ship:
            self.reserve(spec.export_dir)
        self.queue.append(_Task(kind, key, spec, request))

    def reserve(self, export_dir: str) -> None:
        """One more task will read this export: a shipped entry stays in the object store."""
        if self.ship:
            self._readers[export_dir] = self._readers.get(export_dir, 0) + 1

    def release(self, export_dir: str) -> None:
        """A reader of this export is done (or will never run): the last one frees it."""
        if self.ship:
            left = self._readers[export_dir] = self._readers[export_dir] - 1
            if left == 0:
                self.payloads.pop(export_dir, None)

    def _ended(self, task: _Task) -> None:
        """A task ended for good: an export nothing will read any more leaves the object store."""
        if not self.ship:
            return
        if task.kind == "bench":
            self.release(task.spec.export_dir)
        elif task.kind == "pair":
            self.release(task.spec.baseline.export_dir)
            self.release(task.spec.candidate.export_dir)

    def _fits(self, task: _Task) -> bool:
        """Its pool has room, and the CPUs running tasks hold leave enough for it (a CPU
        benchmark holds its whole node: an export queued meanwhile waits here, unstarted,
        rather than in Ray with its clock running)."""
        if sum(1 for t in self.running.values() if t.request.pool == task.request.pool) >= self.capacity.limits[task.request.pool]:
            return False
        held = sum(t.request.options.get("num_cpus", 1) for t in self.running.values())
        return held + task.request.options.get("num_cpus", 1) <= max(self.capacity.total_cpus, 1)

    def _start_queued(self, exports_only: bool = False) -> None:
        """Hand Ray only what can start now: a queued task's clock has not started.
        Exports start in order; benchmarks in random order (`exports_only`: none)."""
        if self.queue:
            self.forks.await_ready()
        exports = [t for t in self.queue if t.kind == "export"]
        benches = [] if exports_only else [t for t in self.queue if t.kind != "export"]
        self.rng.shuffle(benches)
        forks = str(self.forks.base) if self.forks.base else self.cluster.fork_server  # fork_hosts.fork_folder's
        for task in exports + benches:
            if not self._fits(task):
                continue
            fn = self._remote[task.kind]
            options = {**task.request.options, "max_retries": 0}  # retries are ours: counted and recorded
            args = (task.spec, self.cluster.task_timeout_s, forks)
            if task.kind == "export":
                task.ref, task.payload = fn.options(**options, num_returns=2).remote(*args, self.ship)
            elif task.kind == "bench":
                packed = self.payloads.get(task.spec.export_dir) if self.ship else None
                task.ref = fn.options(**options).remote(*args, packed)
            elif task.kind == "pair":
                sides = (task.spec.baseline.export_dir, task.spec.candidate.export_dir)
                packed = tuple(self.payloads.get(d) if self.ship else None for d in sides)
                task.ref = fn.options(**options).remote(*args, packed)
            else:
                task.ref = fn.options(**options).remote(*args)
            task.attempts += 1
            task.started = time.monotonic()
            self.running[task.ref] = task
            self.queue.remove(task)

    def results(self) -> Iterator[tuple[str, str, Any]]:
        """Yield (kind, key, result | Failure) as tasks end, and ("retry", key, cause) when
        a task whose process died is run again; more may be submitted meanwhile. Yields
        ("tick", "", None) about every second, so the caller can keep a heartbeat."""
        self.start()
        import ray  # lazy: ray, only once a run starts
        from ray.exceptions import RayError  # lazy: ray, only once a run starts

        while self.queue or self.running or self.done:
            while self.done:
                yield self.done.popleft()
            self._start_queued()
            if not self.running:  # all that was queued is done (what the results above queued has started)
                continue
            ready = _wait(ray, list(self.running))
            for ref in ready:
                task = self.running.pop(ref)
                stage = STAGES[task.kind]
                try:
                    result = ray.get(ref)
                except RayError as e:  # the worker died, ran out of memory, or was cancelled
                    cause, full = root_cause(e)
                    if type(e).__name__ in RETRIABLE and task.attempts <= self.cluster.max_retries:
                        self.queue.appendleft(task)
                        yield "retry", f"{task.kind}:{task.key}", cause
                        continue
                    self._ended(task)
                    yield task.kind, task.key, Failure(stage, cause, full)
                    continue
                if task.kind == "export" and result.ok and self.ship:
                    self.payloads[task.spec.out_dir] = task.payload
                self._ended(task)
                if task.kind == "export":  # the next export starts while the driver records this one;
                    self._start_queued(exports_only=True)  # a benchmark waits for the driver to be idle
                yield task.kind, task.key, result
            now = time.monotonic()
            limit = self.cluster.task_timeout_s + STARTUP_GRACE_S
            for ref, task in list(self.running.items()):
                if now - task.started > limit:
                    ray.cancel(ref, force=True)
                    del self.running[ref]
                    stage = STAGES[task.kind]
                    msg = f"timed out: no result {limit:g}s after it was handed to Ray (cluster.task_timeout_s + start-up)"
                    self._ended(task)
                    yield task.kind, task.key, Failure(stage, msg)
            yield "tick", "", None
