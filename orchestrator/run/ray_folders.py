"""A local Ray's temp folders, `<tmp>/phasesweep-ray-<uid>/tmp*` (its sessions, logs and
sockets; stdlib only). Each start makes a folder of its own and holds a lock in it while its
Ray runs. Once a local Ray has stopped, the folders beyond the newest KEEP that nothing
uses any more are removed, so a machine that runs many sweeps (a bisect, a nightly history)
does not fill its temp folder with old Ray logs."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from orchestrator.common.ray_env import socket_safe
from orchestrator.run import reaper

KEEP = 20  # the newest folders stay, their Ray's logs with them
AT_MOST = 2  # folders removed per stop: one more than a start adds, so many old ones shrink to KEEP over sweeps
LOCK = "phasesweep.lock"  # held by the driver whose Ray the folder is, while that Ray runs

_held: list[int] = []  # this process's locks: released when its Ray stops (stopped) or it exits


def root() -> Path:
    """The per-user folder of the machine's temp folder, or of /tmp where that is too long
    for Ray's socket paths."""
    return socket_safe(Path(tempfile.gettempdir()) / f"phasesweep-ray-{os.getuid()}", len("/12345678"))


def new_folder() -> str:
    """A new folder for a local Ray's files, locked by this process until stopped() or its exit."""
    base = root()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(dir=base)
    fd = os.open(os.path.join(folder, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else holds it
    _held.append(fd)
    return folder


def stopped(keep: int = KEEP, at_most: int = AT_MOST) -> list[Path]:
    """Once this process's local Ray has stopped: its folders' locks released (the folders stay,
    among the newest), then prune()."""
    while _held:
        os.close(_held.pop())
    return prune(keep, at_most)


def prune(keep: int = KEEP, at_most: int = AT_MOST) -> list[Path]:
    """Remove up to `at_most` of the folders older than the newest `keep` (by modification
    time) that no driver holds and no live process names or holds a file in; returns them."""
    try:
        entries = [e for e in os.scandir(root()) if e.name.startswith("tmp") and e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    dated = []
    for e in entries:
        try:
            dated.append((e.stat(follow_symlinks=False).st_mtime, Path(e.path)))
        except FileNotFoundError:  # removed meanwhile by another sweep's prune
            continue
    removed: list[Path] = []
    for _, folder in sorted(dated, reverse=True)[keep:]:
        if len(removed) == at_most:
            break
        if _remove_unused(folder):
            removed.append(folder)
    return removed


def _remove_unused(folder: Path) -> bool:
    """Remove `folder` unless its lock is held or a live process uses it (a folder made before
    folders were locked has no lock: its processes alone tell)."""
    try:
        fd: int | None = os.open(folder / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError:  # not ours to read: not ours to remove
        return False
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its driver lives (in any process namespace)
                return False
        if reaper.Session(str(folder), since=0).live():
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return not folder.exists()
    finally:
        if fd is not None:
            os.close(fd)
