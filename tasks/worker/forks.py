"""Fresh processes in milliseconds: a node's fork server imports the heavy modules once and
forks a child per task (tasks/worker/fresh.py). The server never runs a job nor starts a
thread pool, so each child is as fresh as a spawned one (`process_ran_before` stays "nothing").

One server per folder (per node and Ray job), started by a long-lived process of the node
(`start`, under a lock) and ended with it or after IDLE_S idle. A task `connect`s, waiting for
a start under way; none listening, it spawns instead. Stdlib only at import.

Protocol, one connection per task over a Unix socket in a folder only this user can enter:
the client sends (fn, spec, its environment) pickled; the server forks and answers
("pid", pid); the child sends ("result", result) and exits; the server sends ("exit", status).
A client that hangs up takes its child with it.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tasks.measure.machine import alive, die_with_parent
from tasks.worker.heap import imports_uncollected

SOCKET = "forks.sock"
LOCK = "forks.lock"
READY = "ready"  # the line the server prints once it has imported and listens
IDLE_S = 600.0  # a server without a task this long ends (a job on a cluster that outlives it)
START_TIMEOUT_S = 180.0  # imports on a busy node
POLL_S = 0.5
STALE_S = 3600.0  # remove_dead leaves a folder changed this recently: a new one's servers, a dead one's server.log
FORKED = False  # True in a child of a fork server (a benchmark records how its process started)
_AT_FORK: frozenset[str] | None = None  # in a forked child: the modules it was forked with
OWN_PACKAGES = frozenset({"tasks", "orchestrator", "hydra_plugins"})
EXPORT_SERVER = "export"  # the role of the server exports fork from; benchmarks': bench_server(runtime)
EXPORT_BASE = ("torch", "transformers")  # what every export imports first, whatever its format and families
MORE = "--more"  # the server reads the rest of its preload from stdin: one line, or EOF when it is not needed


def bench_server(runtime: str) -> str:
    return f"bench-{runtime}"


class ForkServerError(RuntimeError):
    """The fork server could not be started or reached (the caller may spawn instead)."""


def imported_since_fork() -> tuple[str, ...] | None:
    """The libraries this forked child imported first after its fork, by top-level package
    (the standard library's and this project's left out; a submodule of a library already
    imported is not one): what its server's preload missed, paid for inside the job (a
    benchmark records them: `runtime.imports_after_fork`). None in a process no fork server
    made."""
    if _AT_FORK is None:
        return None
    names = {name.partition(".")[0] for name in sys.modules} - {name.partition(".")[0] for name in _AT_FORK}
    return tuple(
        sorted(n for n in names if n not in sys.stdlib_module_names and n not in OWN_PACKAGES and not n.startswith("_"))
    )


# -- the server ------------------------------------------------------------------------------


def _preload(modules: Iterable[str]) -> None:
    """A module that fails to import is named in a warning (server.log); its tasks then
    import it themselves, and fail there if it is truly missing."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"fork server preload: cannot import {name} ({type(e).__name__}: {e})", stacklevel=2)


def _child(conn: Connection, job: bytes, listener: socket.socket, others: Iterable[Connection]) -> None:
    """In the forked child: nothing of the server but its imports, then the job."""
    global FORKED, _AT_FORK
    FORKED = True
    _AT_FORK = frozenset(sys.modules)
    try:
        listener.close()
        for c in others:
            c.close()
        die_with_parent()  # the server ends: so does its child
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            import numpy as np  # lazy: a fork server imports only its role's modules

            np.random.seed(int.from_bytes(os.urandom(4), "little"))  # as a spawned process draws its own
        except ImportError:
            pass
        fn, spec, env = pickle.loads(job)  # unpickled here: the server never runs a job's code
        # the asking process's environment, as a spawned child would have inherited it: Ray sets
        # some per task (CUDA_VISIBLE_DEVICES of the GPU it granted, OMP_NUM_THREADS, ...)
        os.environ.clear()
        os.environ.update(env)
        conn.send(("result", fn(spec)))  # the jobs return failures as results; they do not raise
        conn.close()
        code = 0
    except BaseException:  # noqa: BLE001 - the client sees the exit status
        traceback.print_exc()
        code = 1
    os._exit(code)


def serve(folder: Path, watch_pid: int | None, preload: Iterable[str], idle_s: float = IDLE_S, more: bool = False) -> None:
    """Import `preload` (with `more`: then the modules of the line its starter writes to stdin,
    or end at EOF), listen on folder/forks.sock, fork a child per connection; end when
    `watch_pid` ends or after `idle_s` without a task.

    The imports run with the cyclic collector off and are then frozen (tasks/worker/heap.py): the
    server starts faster, and a child's collections walk only the child's own objects."""
    with imports_uncollected():
        _preload(preload)
        if more:
            rest = sys.stdin.readline()
            if not rest:  # its starter did not need it after all
                shutil.rmtree(folder, ignore_errors=True)
                return
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # its children's stdin, as a spawned one's
            _preload(rest.split())
    path = folder / SOCKET
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    print(READY, flush=True)
    os.dup2(2, 1)  # the starter stops reading: the children's prints go to the log
    children: dict[int, Connection] = {}  # pid -> its client's connection
    kept_by_parent = watch_pid is not None and os.getppid() == watch_pid  # re-parented the moment it ends
    try:
        _loop(listener, children, watch_pid, kept_by_parent, idle_s)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        listener.close()
        path.unlink(missing_ok=True)
    # ended as it should: its folder goes (a server that crashed leaves its server.log)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.parent.rmdir()  # the node's and job's folder, once its last server is gone
    except OSError:
        pass


def _loop(listener: socket.socket, children: dict[int, Connection], watch_pid: int | None, kept_by_parent: bool, idle_s: float) -> None:
    """Fork a child per connection and report each child's exit to its client, until
    `watch_pid` ends or `idle_s` pass without a child."""
    last = time.monotonic()
    while True:
        readable, _, _ = select.select([listener, *children.values()], [], [], POLL_S)
        if _reap(children, readable):
            last = time.monotonic()
        if listener in readable:
            _accept(listener, children)
        if watch_pid is not None and ((kept_by_parent and os.getppid() != watch_pid) or not alive(watch_pid)):
            return
        if not children and time.monotonic() - last > idle_s:
            return


def _reap(children: dict[int, Connection], readable: list) -> bool:
    """Each ended child's exit code sent to its client; a child whose client hung up (it only
    reads after sending) killed. Whether any ended."""
    ended = False
    for pid, conn in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            try:
                conn.send(("exit", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            conn.close()
            del children[pid]
            ended = True
        elif conn in readable:
            os.kill(pid, signal.SIGKILL)
    return ended


def _accept(listener: socket.socket, children: dict[int, Connection]) -> None:
    """The waiting client's job, run in a child forked for it alone."""
    sock, _ = listener.accept()
    conn = Connection(sock.detach())
    try:
        job = conn.recv_bytes()  # read now: from here on, a readable connection means a hang-up
    except (EOFError, OSError):
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(conn, job, listener, children.values())
    conn.send(("pid", pid))
    children[pid] = conn


# -- the client ------------------------------------------------------------------------------


def _connect(path: Path) -> Connection | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return Connection(sock.detach())


def _folder(folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)  # only this user reaches the socket
    return folder


class Starting:
    """A server being started: its folder stays locked (clients that come wait for it)
    until `wait()` has seen it ready, or failed."""

    def __init__(self, folder: Path, lock: Any, watch_pid: int, preload: tuple[str, ...], more: bool = False):
        self.folder, self.lock = folder, lock
        # not in a session of its own: whoever ends this process tree ends it
        cmd = [sys.executable, "-m", "tasks.worker.forks", str(folder), str(watch_pid), *([MORE] if more else []), *preload]
        root = Path(__file__).resolve().parent.parent  # this checkout's tasks/, also in a Ray job's working dir
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
        with (folder / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.PIPE if more else subprocess.DEVNULL, env=env, close_fds=True
            )

    def preload(self, modules: tuple[str, ...] | None) -> None:
        """A server begun with more to come: what it imports next, before it listens; None: it
        is not needed, and ends."""
        try:
            if modules is not None:
                self.proc.stdin.write((" ".join(modules) + "\n").encode())
            self.proc.stdin.close()
        except OSError:  # it ended already: wait() says so
            pass

    def wait(self) -> None:
        """Until the server has imported and listens; ForkServerError if it does not."""
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
                if ready:
                    line = self.proc.stdout.readline()
                    if line.strip() == READY.encode():
                        self.proc.stdout.close()
                        return
                    if not line:  # it ended
                        break
                if self.proc.poll() is not None:
                    break
            self.proc.kill()
            raise ForkServerError(f"the fork server in {self.folder} did not start (see {self.folder / 'server.log'})")
        finally:
            self.lock.close()  # frees the lock: waiting clients connect, or spawn


def begin(folder: str | Path, watch_pid: int, preload: tuple[str, ...], more: bool = False) -> Starting | None:
    """Start the server of `folder` unless one listens there (None then); `wait()` on what
    this returns. It ends when `watch_pid` (the long-lived process that keeps it) ends. With
    `more`, it imports `preload`, then waits for the rest (Starting.preload) before it listens."""
    folder = _folder(folder)
    lock = (folder / LOCK).open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # clients that come meanwhile wait for the start
    conn = _connect(folder / SOCKET)
    if conn is not None:
        conn.close()
        lock.close()
        return None
    try:
        return Starting(folder, lock, watch_pid, preload, more)
    except BaseException:
        lock.close()
        raise


def remove_dead(parent: Path, stale_s: float = STALE_S) -> list[Path]:
    """Remove the folders under `parent` (one per driver, or per Ray job and node) whose every
    server is gone; returns them. A server killed at once with its driver (SIGKILL to their
    process group) cannot remove its own folder: a later sweep's stop does. A folder changed in
    the last `stale_s` stays: its servers may be about to start."""
    try:
        bases = [Path(e.path) for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
    except OSError:  # none yet, or not this user's to read: nothing to remove
        return []
    removed = []
    for base in bases:
        try:
            if time.time() - base.stat().st_mtime < stale_s:
                continue
            for role in [Path(e.path) for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]:
                _remove_if_dead(role)
            base.rmdir()  # only once empty: a server that lives, or starts, keeps it
        except OSError:  # not empty, or removed meanwhile by another sweep's stop
            continue
        removed.append(base)
    return removed


def _remove_if_dead(folder: Path) -> None:
    """Remove a server's folder unless its server starts (holds the lock) or listens."""
    with (folder / LOCK).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # starting
            return
        conn = _connect(folder / SOCKET)
        if conn is not None:
            conn.close()  # the server reads no job and goes on
            return
        shutil.rmtree(folder, ignore_errors=True)


def start(folder: str | Path, watch_pid: int, preload: tuple[str, ...]) -> None:
    """begin() and wait(): return once the server of `folder` listens."""
    starting = begin(folder, watch_pid, preload)
    if starting is not None:
        starting.wait()


def connect(folder: str | Path) -> Connection:
    """A connection to the server of `folder`, once a start under way there has ended.
    ForkServerError when none listens (the caller spawns instead)."""
    folder = _folder(folder)
    conn = _connect(folder / SOCKET)
    if conn is None:
        with (folder / LOCK).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(folder / SOCKET)
    if conn is None:
        raise ForkServerError(f"no fork server listens in {folder}")
    return conn


def run(conn: Connection, fn: Callable[[Any], Any], spec: Any, timeout_s: float | None) -> tuple[str, Any]:
    """fn(spec) in a child forked for it: ("result", value), ("died", exit code),
    ("timeout", None) (the child is killed) or ("lost", None) (the server went away).
    `timeout_s` counts from the fork."""
    try:
        conn.send((fn, spec, dict(os.environ)))
        kind, pid = conn.recv()
        if not conn.poll(timeout_s):
            os.kill(pid, signal.SIGKILL)
            return "timeout", None
        kind, value = conn.recv()
        return ("result", value) if kind == "result" else ("died", value)
    except EOFError:  # the server went away (its server.log says why) and its children with it
        return "lost", None
    finally:
        conn.close()


if __name__ == "__main__":
    from tasks.worker import (
        forks as _this,  # the module by its name, not __main__: its children set tasks.worker.forks.FORKED
    )
    from tasks.worker.heap import manage_process

    manage_process()  # its imports frozen for its children (serve)

    _folder, _watch, *_modules = sys.argv[1:]
    _more = _modules[:1] == [MORE]
    _this.serve(Path(_folder), int(_watch) or None, _modules[_more:], more=_more)
