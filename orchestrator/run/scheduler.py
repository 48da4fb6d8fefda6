"""Ray: start or join, the queue, timeouts, retries; nothing else.

What each task asks Ray for is decided when the plan is made (orchestrator/plan/placement.py);
the scheduler hands Ray only what can start now, so a task's clock measures its own run
(the clock starts when the task is handed to Ray: worker start-up is counted in it).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from orchestrator.plan.config import ClusterCfg, ConfigError
from orchestrator.plan.placement import BENCH_RESOURCE, Capacity, Request, capacity_of, local_capacity
from tasks.specs import Failure
from tasks.worker.heap import imports_uncollected

log = logging.getLogger("phasesweep")

# Environment for a local Ray, set before ray is first imported (Ray reads it at import):
# - RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps the node IP on loopback, so gcs_server,
#   raylet, workers and agents bind 127.0.0.1 only (with _node_ip_address alone Ray
#   resolves 127.0.0.1 to the machine's routable IP and binds every interface);
# - RAY_AUTH_MODE=token keeps token auth on, stated rather than warned about;
# - no usage statistics leave the machine.
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}


def _import_ray_on_loopback():
    """Import ray so that a local instance listens on loopback only."""
    import sys

    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    already = "ray" in sys.modules
    import ray

    if already:  # imported before our environment was set: apply the same switches directly
        from ray._private import ray_constants
        from ray._raylet import Config

        ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] not in ("0", "false")
        # Ray's C++ config read RAY_AUTH_MODE at import: re-read it, or this driver would not
        # send the token the GCS it starts (which inherits RAY_AUTH_MODE=token) asks for
        Config.initialize("")
    return ray


def _fork_folder(forks: bool | str, role: str) -> str | None:
    """The folder of this node's fork server of `role` (tasks/worker/forks.py), or None to spawn:
    servers per node and sweep, so a sweep's children run the code its servers imported; one
    for exports and one per runtime (tasks/jobs.fork_servers). `forks`: the folder of a local
    Ray's servers, which the driver keeps; True: this node's, kept by its host actor for this
    Ray job; False: none."""
    if not forks:
        return None
    if isinstance(forks, str):
        return str(Path(forks) / role)
    import ray

    ctx = ray.get_runtime_context()
    return str(_fork_base(ctx.get_job_id(), ctx.get_node_id()) / role)


def _fork_base(job_id: str, node_id: str) -> Path:
    """Where a node's fork servers of a Ray job keep their sockets and logs."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"phasesweep-forks-{os.getuid()}" / f"{job_id}-{node_id[:16]}"


class _ForkServerHost:
    """A Ray actor per node that keeps the node's fork servers: Ray ends whatever an ordinary
    task's worker leaves running when that worker exits, and ends this actor, hence its
    servers, with the job. All start at once, each folder locked until its server is ready;
    the actor is ready once the export server is (the first tasks are exports), and the
    benchmarks' servers finish starting behind it (a benchmark that comes first waits)."""

    def __init__(self, servers: dict[str, tuple[str, ...]]):
        import threading

        from tasks.worker import forks
        from tasks.worker.forks import EXPORT_SERVER

        starting = {role: forks.begin(_fork_folder(True, role), os.getpid(), mods) for role, mods in servers.items()}
        first = starting.pop(EXPORT_SERVER, None)
        self._rest = threading.Thread(target=self._wait_all, args=(list(starting.values()),), daemon=True)
        self._rest.start()
        if first is not None:
            first.wait()

    @staticmethod
    def _wait_all(starting: list[Any], warn: Callable[[], bool] = lambda: True) -> None:
        """Each start's end; a failed one is logged (when `warn()`): its runtime's benchmarks spawn."""
        for s in starting:
            if s is not None:
                try:
                    s.wait()
                except Exception as e:  # noqa: BLE001 - that runtime's benchmarks spawn their processes
                    if warn():
                        log.warning("%s", e)

    def ready(self) -> bool:
        return True


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _export_entry(spec, timeout_s, forks, ship):
    """The export, into this node's own cache (tasks/worker/transfer.py); with `ship`, its entry
    packed as the task's second return, which Ray's object store takes to any node."""
    from dataclasses import replace

    from tasks.jobs import export_in_fresh_process  # heavy imports happen in the worker's child
    from tasks.worker.forks import EXPORT_SERVER
    from tasks.worker.transfer import node_entry, pack

    forks = _fork_folder(forks, EXPORT_SERVER)
    result = export_in_fresh_process(replace(spec, out_dir=node_entry(spec.out_dir)), timeout_s, forks)
    if not result.ok:
        return result, None
    result.details["ray_node"] = _node_id()
    return result, pack(result.out_dir) if ship else None


def _bench_entry(spec, timeout_s, forks, packed=None):
    """The benchmark on this node's copy of its export: fetched from what the export sent
    when this node's cache lacks it (no shared filesystem needed)."""
    from dataclasses import replace

    from tasks.jobs import bench_in_fresh_process  # a process of its own, whatever the worker ran
    from tasks.specs import BenchResult, Failure
    from tasks.worker.forks import bench_server
    from tasks.worker.transfer import localise, node_entry

    spec = replace(spec, export_dir=node_entry(spec.export_dir))
    try:
        source = localise(spec.export_dir, packed)
    except (OSError, ValueError) as e:
        return BenchResult(spec.variant, ok=False, failure=Failure("load", f"the export is not on this node: {e}"))
    result = bench_in_fresh_process(spec, timeout_s, _fork_folder(forks, bench_server(spec.runtime)))
    result.params.update(ray_node=_node_id(), export_source=source)
    return result


def _capture_entry(spec, timeout_s, _forks):
    from tasks.phases.captured import capture_in_fresh_process  # the application runs in the worker's child

    return capture_in_fresh_process(spec, timeout_s)  # spawned: the application's imports are its own


STAGES = {"export": "export", "bench": "benchmark", "capture": "capture"}  # task kind -> a Failure's stage

# Ray errors after which a task is run again (up to cluster.max_retries): its process or
# node went away; anything else (a cancelled task, an error in our own entry) is final
RETRIABLE = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "ActorDiedError")
# the driver's own clock is a backstop: the task's process enforces cluster.task_timeout_s
# from its own start; this much more allows for a worker's start-up under load
STARTUP_GRACE_S = 120.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


REACH_TIMEOUT_S = 10.0
FORK_SERVER_START_S = 180.0  # a node's fork server imports torch, transformers, ONNX, ExecuTorch


def check_reachable(address: str) -> None:
    """A cluster address must answer within seconds (ray.init would wait for minutes): the
    head's GCS port for host:port and ray://host:port, the address this machine's running
    cluster recorded for "auto"."""
    import socket

    where = address
    if address == "auto":
        where = os.environ.get("RAY_ADDRESS", "")
        current = Path("/tmp/ray/ray_current_cluster")
        if not where and current.is_file():
            where = current.read_text().strip()
        if not where:
            raise ConfigError(
                "cluster.address='auto' found no running Ray cluster on this machine (no RAY_ADDRESS, no "
                "/tmp/ray/ray_current_cluster); start one (scripts/cluster.sh head --bench) or give host:port"
            )
    host, _, port = where.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=REACH_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        found = f" (found {where})" if where != address else ""
        raise ConfigError(
            f"cluster.address={address!r}{found} cannot be reached: {getattr(e, 'strerror', None) or e}; "
            "is the head running (scripts/cluster.sh head) and the address right?"
        ) from None


START_LOCK = "phasesweep-ray-start.lock"  # in the machine's temp folder
NODE_START_TIMEOUT = "The current node timed out during startup"  # Ray's words when a raylet missed its 30 s
LOCAL_START_ATTEMPTS = 3


@contextmanager
def beside(fn: Any, *args: Any) -> Iterator[None]:
    """fn(*args) in a thread of its own while the block runs; its exception raised after the
    block. The block's own exception waits for it too (a Ctrl-C during Ray's start still finds
    the plan's runs whole, and closes them)."""
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


@contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Sweeps started at once on one machine start their local Rays one at a time. Each start
    spawns a GCS, a raylet and their Python agents, and Ray gives a raylet a fixed 30 s to
    register: 8 at once on 2 busy cores missed it ("The current node timed out during
    startup"), 6 of 8 sweeps failing before any work. Under an exclusive lock on a file in
    the temp folder, held for the start only (a few seconds) and freed if the driver dies."""
    import fcntl
    import tempfile

    try:
        f = (Path(tempfile.gettempdir()) / START_LOCK).open("a")
    except OSError:  # no lock to be had: start as before
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _start_local(start: Callable[[], Any], attempts: int = LOCAL_START_ATTEMPTS) -> None:
    """`start()` (ray.init of a local Ray), again when its raylet missed Ray's fixed 30 s to
    register with the GCS ("The current node timed out during startup"): on a busy machine a
    single start missed it (seen beside the two-node cluster test on 2 cores). What a failed
    start had started is ended each time, its agents included (orchestrator/run/reaper.py)."""
    for attempt in range(1, attempts + 1):
        try:
            start()
            return
        except Exception as e:
            if NODE_START_TIMEOUT not in str(e):
                raise
            ended = _end_failed_start(e)
            if attempt == attempts:
                raise
            log.warning(
                "the local Ray did not start: its raylet did not register within Ray's 30 s (a busy "
                "machine); ended what it had started (%d processes), starting it again (%d of %d)",
                ended, attempt + 1, attempts,
            )


def _end_failed_start(e: BaseException) -> int:
    """End the processes of a local Ray whose start raised `e`: Ray's node object, found in the
    traceback (ray.init never returns it), lists them, and the watchdog ends what they started
    (the raylet's agents). Returns how many processes the node listed."""
    from orchestrator.run import reaper

    node, tb = None, e.__traceback__
    while tb is not None:  # the innermost frame of the node's __init__ holds it as `self`
        candidate = tb.tb_frame.f_locals.get("self")
        if all(hasattr(candidate, a) for a in ("all_processes", "kill_all_processes", "get_session_dir_path")):
            node = candidate
        tb = tb.tb_next
    if node is None:
        return 0
    pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
    watchdog = reaper.watch(node.get_session_dir_path(), pids)
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    watchdog.close()  # its pipe closed: it ends what is left of that session, then exits
    return len(pids)


def _watch_local_session(ray: Any) -> Any:
    """Start the watchdog (orchestrator/run/reaper.py) of the local Ray just started: when this
    driver is gone, however it ended (SIGKILL included), the watchdog ends what of the Ray
    session outlives it (its agents did, for a minute). None when Ray's node is not found."""
    from orchestrator.run import reaper

    node = getattr(ray._private.worker, "_global_node", None)  # Ray's own record of what it started
    pids = [info.process.pid for infos in getattr(node, "all_processes", {}).values() for info in infos]
    if not pids:  # not a node this process started (one joined has no processes of ours)
        return None
    return reaper.watch(node.get_session_dir_path(), pids)


def _restore_handlers(handlers: dict[int, Any]) -> None:
    """Install Python's handlers again, so the OS's actions match them (main thread only)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


def root_cause(e: BaseException) -> tuple[str, str]:
    """(one line naming the root cause, the full text) of a Ray error: a task's own
    exception rather than Ray's coloured worker header."""
    cause = getattr(e, "cause", None) or e
    text = ANSI.sub("", str(cause)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first = lines[-1] if cause is not e and lines else (lines[0] if lines else "")
    return f"{type(cause).__name__}: {first}"[:500], ANSI.sub("", str(e))


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


class Scheduler:
    def __init__(self, cluster: ClusterCfg, seed: int | None = None):
        self.cluster = cluster
        # benchmarks start in random order (Google Benchmark's random interleaving): the
        # repeats of one variant are spread across the sweep, not run back to back
        self.seed = seed if seed is not None else random.randrange(2**31)
        self.rng = random.Random(self.seed)
        self.owned = False
        self.watchdog: Any = None  # orchestrator.run.reaper.Watchdog of the local Ray this driver started
        self.queue: deque[_Task] = deque()
        self.running: dict[Any, _Task] = {}
        # exports travel through Ray's object store on a joined cluster, whose nodes need not
        # share a filesystem; a local Ray's tasks and driver share this machine's cache
        self.ship = cluster.address is not None
        self.payloads: dict[str, Any] = {}  # export cache entry (as planned) -> its packed entry's ref
        self._readers: dict[str, int] = {}  # export cache entry -> benchmarks queued or running on it
        self._fetched: Path | None = None  # where the driver unpacks what it logs
        self._hosts: list[Any] = []  # the fork server host actors (tasks/worker/forks.py), one per node
        self._hosts_ready: list[Any] = []
        self._nodes: list[str] = []  # ids of the nodes given fork servers
        self._job_id = ""
        self._node = ""  # the driver's node, once Ray runs
        self.done: deque[tuple[str, str, Any]] = deque()  # results known without a task (exports in the cache)
        # A local Ray is started with what this machine offers, measured here, so the plan is
        # made on it before Ray starts and Ray's start runs beside the fork servers' imports
        # and the tracking store's opening; a joined cluster's capacity (or that of a Ray this
        # process already runs) is read from it once joined.
        already = sys.modules.get("ray")
        self.own_local = cluster.address is None and not (already is not None and already.is_initialized())
        self.capacity: Capacity | None = local_capacity(cluster.num_cpus) if self.own_local else None
        self._started = False
        self._forks_base: Path | None = None  # a local Ray's fork servers (kept by this driver) live under it
        self._starting: dict[str, Any] = {}  # role -> tasks.worker.forks.Starting, not yet awaited
        self._servers: list[Any] = []  # the driver's fork servers' processes

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start a local Ray, or join the cluster (once; later calls return)."""
        if self._started:
            return
        self._started = True
        with imports_uncollected():  # Ray's import and start make objects to keep (tasks/worker/heap.py)
            self._start()

    def _start(self) -> None:
        local = self.cluster.address is None
        if local:
            ray = _import_ray_on_loopback()
        else:
            import ray

        if not ray.is_initialized():
            import signal

            sigterm = signal.getsignal(signal.SIGTERM)
            common = {"log_to_driver": False, "logging_level": "warning", "configure_logging": True}
            if local:
                cap = self.capacity or local_capacity(self.cluster.num_cpus)
                start = partial(
                    ray.init,
                    address="local",  # a Ray of its own, even beside a cluster started on this machine
                    num_cpus=cap.cpus,  # what the plan was made on, exactly
                    num_gpus=cap.gpus,
                    _memory=cap.memory,  # Ray's "memory" resource (ray.init's own name for it)
                    resources={BENCH_RESOURCE: 1},
                    include_dashboard=self.cluster.dashboard,
                    dashboard_host="127.0.0.1",
                    _node_ip_address="127.0.0.1",
                    **common,
                )
                with _one_start_at_a_time():
                    _start_local(start)
                self.watchdog = _watch_local_session(ray)
            else:
                check_reachable(self.cluster.address)
                ray.init(address=self.cluster.address, **common)
            self.owned = True
            # ray.init replaces the driver's SIGTERM handler (with sys.exit(15), and a C++ handler
            # that dumps a stack and aborts: exit 134); the driver's goes back, so SIGTERM unwinds
            # through its exit path, closes every run and exits 143
            if callable(sigterm):
                _restore_handlers({signal.SIGTERM: sigterm})
        # each kind's remote function (the work itself runs in a fresh child process of the
        # worker's: tasks/jobs.in_fresh_process); captures in a worker that ends after them
        self._remote = {
            "export": ray.remote(_export_entry),
            "bench": ray.remote(_bench_entry),
            "capture": ray.remote(max_calls=1)(_capture_entry),
        }
        self._node = _node_id()
        live = self._capacity()
        if self.capacity is None or not self.owned:
            self.capacity = live
        elif (live.cpus, live.gpus, live.bench_slots) != (self.capacity.cpus, self.capacity.gpus, self.capacity.bench_slots):
            raise RuntimeError(f"the local Ray offers {live}, not the capacity it was started with and planned on: {self.capacity}")

    def start_fork_servers(self, servers: dict[str, tuple[str, ...]]) -> None:
        """The fork servers (tasks/worker/forks.py) on every alive node, `servers` (role -> what it
        imports) importing while the driver records the plan; the first task handed to Ray
        waits until each node's export server is ready."""
        if not self.cluster.fork_server or self._hosts or self._forks_base:
            return
        if self.own_local:  # before Ray starts, or beside it: this machine's servers, kept by this driver
            self._start_local_fork_servers(servers)
            return
        self.start()
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host = ray.remote(num_cpus=0, max_restarts=0)(_ForkServerHost)
        self._job_id = ray.get_runtime_context().get_job_id()
        for node in ray.nodes():
            if node.get("Alive"):
                self._nodes.append(node["NodeID"])
                where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                actor = host.options(scheduling_strategy=where).remote(servers)
                self._hosts.append(actor)
                self._hosts_ready.append(actor.ready.remote())

    def _start_local_fork_servers(self, servers: dict[str, tuple[str, ...]]) -> None:
        """A local Ray's fork servers, children of this driver (each ends when it does, or at
        stop()); all start at once, the benchmarks' awaited behind the export server's."""
        import uuid

        from tasks.worker import forks
        from tasks.worker.forks import EXPORT_SERVER

        self._forks_base = _fork_base(f"driver-{os.getpid()}", uuid.uuid4().hex)
        for role, mods in servers.items():
            starting = forks.begin(self._forks_base / role, os.getpid(), mods)
            if starting is not None:
                self._starting[role] = starting
                self._servers.append(starting.proc)
        rest = [s for role, s in self._starting.items() if role != EXPORT_SERVER]
        self._starting = {r: s for r, s in self._starting.items() if r == EXPORT_SERVER}
        # a start that fails because stop() ended it is not worth a warning
        threading.Thread(target=_ForkServerHost._wait_all, args=(rest, lambda: bool(self._servers)), daemon=True).start()

    def holds(self, spec: Any) -> bool:
        """Whether the export is in a local Ray's cache, sealed (submit() verifies it): then
        no export server is needed for it."""
        if not self.own_local:
            return False
        from tasks.worker.entries import MANIFEST
        from tasks.worker.transfer import node_entry

        return (Path(node_entry(spec.out_dir)) / MANIFEST).is_file()

    @property
    def _forks_arg(self) -> bool | str:
        """What a task is told of its node's fork servers (_fork_folder)."""
        return str(self._forks_base) if self._forks_base else self.cluster.fork_server

    def _await_forks(self) -> None:
        """Once, before the first task: every node's export server is ready (or failed: its
        tasks spawn their processes)."""
        from tasks.worker.forks import ForkServerError

        for starting in self._starting.values():  # this driver's (a local Ray's)
            try:
                starting.wait()
            except ForkServerError as e:  # its tasks spawn their processes instead
                log.warning("%s; exports spawn their processes", e)
        self._starting = {}
        pending, self._hosts_ready = self._hosts_ready, []
        if not pending:
            return
        import ray

        if not pending:
            return
        ready, late = ray.wait(pending, num_returns=len(pending), timeout=FORK_SERVER_START_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - its node's tasks spawn their processes instead
                log.warning("a fork server did not start (%s); that node's tasks spawn their processes", root_cause(e)[0])
        if late:
            log.warning(
                "%d node(s)' fork servers not ready after %gs; their tasks wait for them, or spawn where none started",
                len(late),
                FORK_SERVER_START_S,
            )

    def stop(self) -> None:
        import signal

        ray = sys.modules.get("ray")  # None: Ray was never imported, so never started here
        # the fork servers' folders on this machine (a local Ray's, or a node's beside the
        # driver): Ray ends the servers with their actors, before they could remove them
        folders = [_fork_base(self._job_id, n) for n in self._nodes] if self._hosts else []
        try:
            if self.owned and ray is not None and ray.is_initialized():
                # Ray's shutdown resets SIGTERM's action at the OS level to the default (die at
                # once) while Python still lists the driver's handler (seen in /proc: SigCgt loses
                # SIGTERM inside ray.shutdown): install the driver's handlers again after it
                handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
                try:
                    ray.shutdown()
                    self.owned = False
                finally:
                    _restore_handlers(handlers)
        finally:
            servers, self._servers = self._servers, []
            for proc in servers:  # the driver's: their children (tasks' processes) end with them
                proc.terminate()
            for proc in servers:
                try:
                    proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - not ending on SIGTERM: it is killed
                    proc.kill()
                    proc.wait()
            if self._forks_base is not None:
                folders.append(self._forks_base)
                self._forks_base = None
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
            if self._fetched is not None:
                shutil.rmtree(self._fetched, ignore_errors=True)
                self._fetched = None
            self.payloads.clear()
            if self.watchdog is not None:
                self.watchdog.close()  # it ends what ray.shutdown left, if anything, and exits
                self.watchdog = None

    @contextmanager
    def stopping(self) -> Iterator[None]:
        """stop() in a thread of its own while the block runs (Ray's shutdown is mostly
        waiting on its processes); the driver's signal handlers installed again here, in the
        main thread, once both are done; stop()'s exception raised after the block's."""
        import signal

        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            with beside(self.stop):
                yield
        finally:
            _restore_handlers(handlers)

    def export_folder(self, planned: str, made: str) -> Path:
        """A folder on the driver's machine holding the export the plan calls `planned`: the
        entry where its task `made` it on a local Ray (this machine), else a copy unpacked
        from what the export task sent."""
        packed = self.payloads.get(planned)
        if packed is None:
            return Path(made)
        import tempfile

        import ray

        from tasks.worker.transfer import localise

        if self._fetched is None:
            self._fetched = Path(tempfile.mkdtemp(prefix="phasesweep-exports-"))
        folder = self._fetched / Path(planned).name
        localise(folder, ray.get(packed))
        return folder

    def _capacity(self) -> Capacity:
        import ray

        return capacity_of(ray.nodes(), self.cluster.address)

    # -- running ---------------------------------------------------------------------
    def submit(self, kind: str, key: str, spec: Any, request: Request) -> None:
        """Queue an export (key: its export key), a benchmark (key: the variant's name) or a
        capture (key: its capture key). An export a local Ray's cache holds, complete and
        verified, is a result at once: no task (nor an export server) is needed to read it."""
        if kind == "export" and self.own_local:
            from tasks.worker.entries import cached_export
            from tasks.worker.transfer import node_entry

            hit = cached_export(spec, node_entry(spec.out_dir))
            if hit is not None:
                hit.details["ray_node"] = self._node
                self.done.append((kind, key, hit))
                return
        if kind == "bench" and self.ship:
            self._readers[spec.export_dir] = self._readers.get(spec.export_dir, 0) + 1
        self.queue.append(_Task(kind, key, spec, request))

    def _ended(self, task: _Task) -> None:
        """A task ended for good: an export nothing will read any more leaves the object store."""
        if task.kind == "bench" and self.ship:
            left = self._readers[task.spec.export_dir] = self._readers[task.spec.export_dir] - 1
            if left == 0:
                self.payloads.pop(task.spec.export_dir, None)

    def _in_use(self, pool: str) -> int:
        return sum(1 for t in self.running.values() if t.request.pool == pool)

    def _fits(self, task: _Task) -> bool:
        """Its pool has room, and the CPUs running tasks hold leave enough for it (a CPU
        benchmark holds its whole node: an export queued meanwhile waits here, unstarted,
        rather than in Ray with its clock running)."""
        if self._in_use(task.request.pool) >= self.capacity.limits[task.request.pool]:
            return False
        held = sum(t.request.options.get("num_cpus", 1) for t in self.running.values())
        return held + task.request.options.get("num_cpus", 1) <= max(self.capacity.total_cpus, 1)

    def _start_queued(self) -> None:
        """Hand Ray only what can start now: a queued task's clock has not started.
        Exports start in order; benchmarks in random order."""
        if self.queue:
            self._await_forks()
        exports = [t for t in self.queue if t.kind == "export"]
        benches = [t for t in self.queue if t.kind != "export"]
        self.rng.shuffle(benches)
        for task in exports + benches:
            if not self._fits(task):
                continue
            fn = self._remote[task.kind]
            options = {**task.request.options, "max_retries": 0}  # retries are ours: counted and recorded
            args = (task.spec, self.cluster.task_timeout_s, self._forks_arg)
            if task.kind == "export":
                task.ref, task.payload = fn.options(**options, num_returns=2).remote(*args, self.ship)
            elif task.kind == "bench":
                packed = self.payloads.get(task.spec.export_dir) if self.ship else None
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
        import ray
        from ray.exceptions import RayError

        while self.queue or self.running or self.done:
            while self.done:
                yield self.done.popleft()
            self._start_queued()
            if not self.running:  # all that was queued is done (what the results above queued has started)
                continue
            ready, _ = ray.wait(list(self.running), num_returns=1, timeout=1.0)
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
