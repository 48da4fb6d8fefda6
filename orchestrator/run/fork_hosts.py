"""A sweep's fork servers (tasks/worker/forks.py): one per role and node, so a sweep's tasks
run the code its servers imported. On a local Ray they are the driver's children; on a
cluster one host actor per node keeps its node's servers, and Ray ends them with the job."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.common.ray_env import root_cause
from tasks.worker import forks
from tasks.worker.forks import EXPORT_BASE, EXPORT_SERVER, ForkServerError

log = logging.getLogger("phasesweep")

FORK_SERVER_START_S = 180.0  # a node's fork server imports torch, transformers, ONNX, ExecuTorch


def fork_root() -> Path:
    """This user's fork servers' folders, in this machine's temp folder."""
    return Path(tempfile.gettempdir()) / f"phasesweep-forks-{os.getuid()}"


def fork_base(job_id: str, node_id: str) -> Path:
    """Where a node's fork servers of a Ray job keep their sockets and logs."""
    return fork_root() / f"{job_id}-{node_id[:16]}"


def fork_folder(forks: bool | str, role: str) -> str | None:
    """The folder of this node's fork server of `role`, or None to spawn. `forks`: the folder of
    the driver's servers (a local Ray); True: this node's, kept by its host actor; False: none."""
    if not forks:
        return None
    if isinstance(forks, str):
        return str(Path(forks) / role)
    import ray  # lazy: ray, only once a run starts

    ctx = ray.get_runtime_context()
    return str(fork_base(ctx.get_job_id(), ctx.get_node_id()) / role)


def wait_all(starting: list[Any], warn: Callable[[], bool] = lambda: True) -> None:
    """Each start's end; a failed one is logged (when `warn()`): its runtime's tasks spawn."""
    for s in starting:
        if s is not None:
            try:
                s.wait()
            except Exception as e:  # noqa: BLE001 - that runtime's tasks spawn their processes
                if warn():
                    log.warning("%s", e)


class ForkServerHost:
    """A Ray actor keeping its node's fork servers. All start at once; it is ready once the
    export server is (the first tasks are exports), the others finish starting behind it."""

    def __init__(self, servers: dict[str, tuple[str, ...]]):
        starting = {role: forks.begin(fork_folder(True, role), os.getpid(), mods) for role, mods in servers.items()}
        first = starting.pop(EXPORT_SERVER, None)
        threading.Thread(target=wait_all, args=(list(starting.values()),), daemon=True).start()
        if first is not None:
            first.wait()

    def ready(self) -> bool:  # awaited: the export server is ready
        return True


class ForkServers:
    """The fork servers of one sweep: started once, awaited before the first task, ended at stop()."""

    def __init__(self) -> None:
        self.base: Path | None = None  # a local Ray's servers (the driver's) live under it
        self._starting: dict[str, Any] = {}  # role -> tasks.worker.forks.Starting, not yet awaited
        self._servers: list[Any] = []  # the driver's servers' processes
        self._hosts: list[Any] = []  # the host actors, one per node
        self._hosts_ready: list[Any] = []
        self._folders: list[Path] = []  # the nodes' folders on this machine's temp folder
        self._warm: forks.Starting | None = None  # the export server begun before the plan (warm()), until start_local
        self._local = False  # start_local ran

    @property
    def started(self) -> bool:
        return self._local or bool(self._hosts)

    def warm(self) -> None:
        """Begin this driver's export server before the plan exists: it imports what every
        export needs (EXPORT_BASE) while the driver composes, validates and plans; start_local
        hands it the rest, or ends it when no export is to be made."""
        self.base = fork_base(f"driver-{os.getpid()}", uuid.uuid4().hex)
        self._warm = forks.begin(self.base / EXPORT_SERVER, os.getpid(), EXPORT_BASE, more=True)
        if self._warm is not None:
            self._servers.append(self._warm.proc)

    def start_local(self, servers: dict[str, tuple[str, ...]]) -> None:
        """This driver's servers, for a local Ray (before it starts, or beside its start)."""
        self._local = True
        self.base = self.base or fork_base(f"driver-{os.getpid()}", uuid.uuid4().hex)
        for role, mods in servers.items():
            if role == EXPORT_SERVER and self._warm is not None:  # its process is among _servers already
                starting, self._warm = self._warm, None
                starting.preload(tuple(m for m in mods if m not in EXPORT_BASE))
                self._starting[role] = starting
            elif (starting := forks.begin(self.base / role, os.getpid(), mods)) is not None:
                self._starting[role] = starting
                self._servers.append(starting.proc)
        self._drop_warm()  # every export is in the cache
        rest = [s for role, s in self._starting.items() if role != EXPORT_SERVER]
        self._starting = {r: s for r, s in self._starting.items() if r == EXPORT_SERVER}
        # a start that fails because stop() ended it is not worth a warning
        threading.Thread(target=wait_all, args=(rest, lambda: bool(self._servers)), daemon=True).start()

    def start_on_nodes(self, servers: dict[str, tuple[str, ...]]) -> None:
        """A host actor on every alive node of the Ray this driver joined."""
        self._drop_warm()  # begun for a local Ray: the nodes keep their own
        import ray  # lazy: ray, only once a run starts
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: ray, only once a run starts

        host = ray.remote(num_cpus=0, max_restarts=0)(ForkServerHost)
        job_id = ray.get_runtime_context().get_job_id()
        for node in ray.nodes():
            if node.get("Alive"):
                self._folders.append(fork_base(job_id, node["NodeID"]))
                where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                actor = host.options(scheduling_strategy=where).remote(servers)
                self._hosts.append(actor)
                self._hosts_ready.append(actor.ready.remote())

    def _drop_warm(self) -> None:
        """The export server warm() began, not needed: it ends, and takes its folder with it."""
        if self._warm is not None:
            self._warm.preload(None)
            self._warm.lock.close()
            self._warm = None

    def await_ready(self) -> None:
        """Every export server ready, or failed (its tasks spawn their processes); once."""
        for starting in self._starting.values():
            try:
                starting.wait()
            except ForkServerError as e:
                log.warning("%s; exports spawn their processes", e)
        self._starting = {}
        pending, self._hosts_ready = self._hosts_ready, []
        if not pending:
            return
        import ray  # lazy: ray, only once a run starts

        ready, late = ray.wait(pending, num_returns=len(pending), timeout=FORK_SERVER_START_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - its node's tasks spawn their processes instead
                log.warning("a fork server did not start (%s); that node's tasks spawn their processes", root_cause(e)[0])
        if late:
            why = "their tasks wait for them, or spawn where none started"
            log.warning("%d node(s)' fork servers not ready after %gs; %s", len(late), FORK_SERVER_START_S, why)

    def stop(self) -> None:
        """End the driver's servers (their children, tasks' processes, end with them) and remove
        the servers' folders on this machine (Ray ends a node's servers before they could), and
        those that servers killed with their driver left (forks.remove_dead)."""
        self._drop_warm()
        servers, self._servers = self._servers, []
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - not ending on SIGTERM: it is killed
                proc.kill()
                proc.wait()
        folders = [*self._folders, *([self.base] if self.base else [])]
        self.base, self._folders = None, []
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        forks.remove_dead(fork_root())
