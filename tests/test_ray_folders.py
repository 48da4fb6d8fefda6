"""orchestrator/run/ray_folders.py: a local Ray's temp folder is held while its driver lives, and
a stopped local Ray removes the old folders nothing uses, never a held or used one."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.run import ray_folders, ray_session

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def base(monkeypatch, tmp_path) -> Path:
    """The folders' root, under tmp_path: nothing of this machine's own Rays is touched."""
    folder = tmp_path / "rays"
    folder.mkdir()
    monkeypatch.setattr(ray_folders, "root", lambda: folder)
    return folder


def _folder(base: Path, age_s: float, lock: bool = False) -> Path:
    """A folder as an earlier start left it, `age_s` old; with `lock`, its (free) lock file."""
    folder = Path(tempfile.mkdtemp(dir=base))
    if lock:
        (folder / ray_folders.LOCK).touch()
    (folder / "session_2026-01-01_00-00-00_000000_1" / "logs").mkdir(parents=True)
    stamp = time.time() - age_s
    os.utime(folder, (stamp, stamp))
    return folder


def test_old_unused_folders_go_and_held_used_or_newest_ones_stay(base):
    held = Path(ray_folders.new_folder())  # this process's, as a running driver's
    os.utime(held, (time.time() - 3000, time.time() - 3000))
    used = _folder(base, 2000)  # made before folders were locked; its Ray still runs
    proc = subprocess.Popen([*SLEEP, f"--log_dir={used}/session_2026-01-01_00-00-00_000000_1/logs"])
    free = _folder(base, 1000, lock=True)  # its driver is gone
    legacy = _folder(base, 900)  # no lock, no process
    newest = [_folder(base, 10), _folder(base, 20)]
    (base / "tmp-a-file").write_text("not a folder")
    (base / "other").mkdir()
    try:
        removed = ray_folders.prune(keep=2)
        assert sorted(removed) == sorted([free, legacy])
        assert held.is_dir() and used.is_dir() and all(f.is_dir() for f in newest)
        assert (base / "tmp-a-file").is_file() and (base / "other").is_dir()

        proc.kill()
        proc.wait()
        assert ray_folders.prune(keep=2) == [used]  # its last process ended
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ray_folders.prune(keep=2) == []  # held: its Ray has not stopped
    assert ray_folders.stopped(keep=2) == [held]  # its lock released, it is old: it goes


def test_a_prune_removes_at_most_its_share(base):
    old = [_folder(base, 100 + i) for i in range(4)]
    assert len(ray_folders.prune(keep=1, at_most=2)) == 2
    assert len(ray_folders.prune(keep=1, at_most=2)) == 1  # the newest of them stays
    assert [f for f in old if f.is_dir()] == [old[0]]


def test_a_missing_root_prunes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(ray_folders, "root", lambda: tmp_path / "absent")
    assert ray_folders.prune() == []


def test_a_stopped_local_ray_removes_the_old_folders(base, monkeypatch):
    """ray_session.shutdown: once the local Ray's watchdog has ended, the old folders go."""
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # a Ray another test runs here is not ended
    old = [_folder(base, 1000 + i) for i in range(ray_folders.KEEP + 2)]
    closed = []
    ray_session.shutdown(SimpleNamespace(close=lambda: closed.append(True), end_autoscaler=lambda: []))
    assert closed == [True]
    assert sum(f.is_dir() for f in old) == ray_folders.KEEP
