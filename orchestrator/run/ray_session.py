"""The driver's Ray: start a local one on loopback (again, clean, when a start fails) or join a
cluster; end it. Only public Ray switches, but one guarded fallback for a Ray imported early."""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.common.ray_env import LOCAL_ENV
from orchestrator.common.signals import Terminated
from orchestrator.plan.config import ClusterCfg, ConfigError
from orchestrator.plan.placement import BENCH_RESOURCE, Capacity
from orchestrator.run import ray_folders, reaper

log = logging.getLogger("phasesweep")

LOCAL_START_ATTEMPTS = 3  # a raylet on a busy machine can miss Ray's fixed 30 s to register
START_LOCK = "phasesweep-ray-start.lock"  # in the temp folder: one local start at a time per machine
REACH_TIMEOUT_S = 10.0


def import_ray_on_loopback() -> Any:
    """ray, imported with LOCAL_ENV (values the user set win)."""
    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    already = "ray" in sys.modules
    import ray  # lazy: ray, only once a run starts

    if already:  # imported before LOCAL_ENV was set (a notebook's): its switches are set directly
        ray_constants, config = imported_ray_switches()
        ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] not in ("0", "false")
        config.initialize("")  # re-reads RAY_AUTH_MODE, which the GCS this driver starts inherits
    return ray


def imported_ray_switches() -> tuple[Any, Any]:
    """Ray's private holders of LOCAL_ENV's switches (tests/test_ray_session.py checks them on
    the installed Ray): ray_constants.ENABLE_RAY_CLUSTER and the C++ config's initialize."""
    try:
        from ray._private import ray_constants  # lazy: Ray's private switches, only when Ray came first
        from ray._raylet import Config  # lazy: Ray's private switches, only when Ray came first

        if hasattr(ray_constants, "ENABLE_RAY_CLUSTER") and callable(getattr(Config, "initialize", None)):
            return ray_constants, Config
    except ImportError:
        pass
    env = " ".join(f"{k}={v}" for k, v in LOCAL_ENV.items())
    raise RuntimeError(f"ray was imported before phasesweep could set {env}: set them before ray is imported")


def check_reachable(address: str) -> None:
    """A cluster address must answer within seconds (ray.init would wait for minutes): the
    head's GCS port for host:port and ray://host:port, the address this machine's running
    cluster recorded for "auto"."""
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


def start(cluster: ClusterCfg, cap: Capacity) -> reaper.Watchdog | None:
    """Start a local Ray offering `cap` (cluster.address unset) or join the cluster. Returns the
    local Ray's watchdog, which ends what of it outlives the driver (orchestrator/run/reaper.py)."""
    import ray  # lazy: ray, only once a run starts

    sigterm = signal.getsignal(signal.SIGTERM)
    common = {"log_to_driver": False, "logging_level": "warning", "configure_logging": True}
    try:
        if cluster.address is not None:
            check_reachable(cluster.address)
            ray.init(address=cluster.address, **common)
            return None

        def init(folder: str) -> Any:
            return ray.init(
                address="local",  # a Ray of its own, even beside a cluster started on this machine
                num_cpus=cap.cpus,  # what the plan was made on, exactly
                num_gpus=cap.gpus,
                resources={BENCH_RESOURCE: 1},
                include_dashboard=cluster.dashboard,
                dashboard_host="127.0.0.1",
                # ray.init's documented hidden options: the "memory" resource, the node's IP, its temp folder
                _memory=cap.memory,
                _node_ip_address="127.0.0.1",
                _temp_dir=folder,
                **common,
            )

        with one_start_at_a_time():
            context = start_local(init)
        return reaper.watch(context.address_info["session_dir"])
    except SystemExit as e:  # SIGTERM inside ray.init met its handler there, sys.exit(SIGTERM): the driver's own
        if e.code == signal.SIGTERM:
            raise Terminated() from None
        raise
    finally:
        # ray.init replaces SIGTERM's handler (sys.exit, and a C++ one that aborts): the driver's goes back
        if callable(sigterm):
            restore_handlers({signal.SIGTERM: sigterm})


def start_local(init: Callable[[str], Any], attempts: int = LOCAL_START_ATTEMPTS) -> Any:
    """init(folder), a local Ray's start in a temp folder of its own; when it fails, every
    process of that folder is ended (reaper.Session) and it starts again, up to `attempts`.
    Interrupted (Ctrl-C, SIGTERM), it ends them too and starts nothing more: no watchdog yet
    watches them, and the agents the raylet started outlive it."""
    since = reaper.start_time(os.getpid()) or 0
    attempt = 1
    while True:
        folder = ray_folders.new_folder()
        try:
            return init(folder)
        except BaseException as e:
            ended = reaper.reap(reaper.Session(folder, since))
            if attempt == attempts or not isinstance(e, Exception):
                raise
            attempt += 1
            first = (str(e).strip().splitlines() or [""])[0][:200]
            again = f"ended the {len(ended)} process(es) it had started, starting it again ({attempt} of {attempts})"
            log.warning("the local Ray did not start (%s: %s); %s", type(e).__name__, first, again)


@contextmanager
def one_start_at_a_time() -> Iterator[None]:
    """Local Rays started at once on one machine start one at a time (each start's raylet has a
    fixed 30 s to register): an exclusive lock on a file in the temp folder, freed if the driver dies."""
    try:
        f = (Path(tempfile.gettempdir()) / START_LOCK).open("a")
    except OSError:  # no lock to be had: start unlocked
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def shutdown(watchdog: reaper.Watchdog | None) -> None:
    """ray.shutdown(), the driver's signal handlers kept (Ray resets SIGTERM's OS action); then
    the watchdog ends whatever of a local Ray is left, and exits; then its folders' turn."""
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return
        if watchdog is not None and watchdog.raylet_gone():
            # Ray's core worker ends this process at its next call once its raylet has died, mid
            # summary: no call, at exit neither (Ray's exit handler); the watchdog ends the rest
            atexit.unregister(ray.shutdown)
            log.debug("the local Ray's raylet died: its processes are ended without ray.shutdown()")
            return
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        if watchdog is not None:  # a local Ray's: its monitor would cost the shutdown 1 s
            watchdog.end_autoscaler()
        try:
            ray.shutdown()
        finally:
            restore_handlers(handlers)
    finally:
        if watchdog is not None:
            watchdog.close()
            folders_stopped()


def folders_stopped() -> None:
    """ray_folders.stopped() once a local Ray has stopped (beside the summary): its folder's lock
    released and old folders removed; a failure to is logged, never raised."""
    try:
        if removed := ray_folders.stopped():
            log.debug("removed %d old local Ray folder(s) from %s", len(removed), ray_folders.root())
    except OSError as e:
        log.debug("old local Ray folders not removed: %s", e)


def restore_handlers(handlers: dict[int, Any]) -> None:
    """Install Python's handlers again, so the OS's actions match them (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
