"""orchestrator/run/reaper.py, the watchdog of a local Ray session, on a fake session (no Ray).

A fake driver starts sleeping processes the way a Ray session has them (one whose command line
names the session directory, one with a Ray title and its output in the session's logs, one that
ignores SIGTERM) and processes that are not of the session (another session's, whose directory
name starts with this one's; a process that only holds a file there; a child that names neither),
starts the watchdog, and is killed with SIGKILL: the session's processes must go, the others
stay. Waits are on pidfds (the event of a process's end), each bounded; no fixed sleep.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.run import reaper
from tests.conftest import ROOT

GRACE_S = 1.0  # the watchdog's SIGTERM-to-SIGKILL grace here: the stubborn process costs this much

DRIVER = r"""
import json, signal, subprocess, sys, time
from orchestrator.run import reaper

session, other, grace, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
SLEEP = "import signal, sys, time; 'stubborn' in sys.argv and signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"

def python(*args, **kw):
    return subprocess.Popen([sys.executable, "-c", SLEEP, *args], **kw)

def titled(title, out):  # a Ray title (Ray rewrites its processes' command lines), output to `out`
    with open(out, "w") as f:
        return subprocess.Popen(["bash", "-c", f"exec -a {title} sleep 600"], stdout=f)

def ready(p):
    status = open(f"/proc/{p.pid}/status").read()
    ignored = int(status.split("SigIgn:")[1].split()[0], 16) >> (signal.SIGTERM - 1) & 1
    return ignored or open(f"/proc/{p.pid}/cmdline").read().startswith("ray::")

if mode == "kill":
    ours = {
        "named": python(f"--log_dir={session}/logs"),
        "agent": titled("ray::FakeAgent", f"{session}/logs/agent.out"),
        "stubborn": python(f"--session-dir={session}", "stubborn"),
    }
    theirs = {
        "other_named": python(f"--log_dir={other}/logs"),
        "other_agent": titled("ray::FakeAgent", f"{other}/logs/agent.out"),
        "reader": python(stdout=open(f"{session}/logs/raylet.out", "w")),  # not Ray's: a tail -f, say
        "unnamed": subprocess.Popen(["sleep", "600"]),  # the driver's, not of the session
    }
    deadline = time.monotonic() + 60  # until each is what it is meant to be: a title set, SIGTERM ignored
    while not all(map(ready, [ours["agent"], theirs["other_agent"], ours["stubborn"]])) and time.monotonic() < deadline:
        time.sleep(0.01)
    dog = reaper.watch(session, grace_s=grace)
    pids = {name: p.pid for name, p in {**ours, **theirs}.items()}
    print(json.dumps({"ours": list(ours), "pids": pids, "watchdog": dog.proc.pid}), flush=True)
    sys.stdin.read()  # until killed
else:  # a normal shutdown: the driver ends its session's processes, then closes the watchdog
    named = python(f"--log_dir={session}/logs")
    dog = reaper.watch(session, grace_s=grace)
    named.kill()
    named.wait()
    dog.close()
    print(json.dumps({"watchdog": dog.proc.returncode}), flush=True)
"""


def fake_session(tmp_path: Path, name: str) -> Path:
    (tmp_path / name / "logs").mkdir(parents=True)
    return tmp_path / name


def start_driver(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    session = fake_session(tmp_path, "session_2026-01-01_00-00-00_000000_4242")
    other = fake_session(tmp_path, "session_2026-01-01_00-00-00_000000_42421")  # its name starts with ours
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(session), str(other), str(GRACE_S), mode],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its processes are a group of their own: cleaned up at once, below
    )
    return proc, session


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait, up to `timeout`, for every process in `pids` to end; returns those still running."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:  # gone already
            pass
    deadline = time.monotonic() + timeout
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            ended, _, _ = select.select(list(fds), [], [], left)  # a pidfd reads ready once its process ended
            for fd in ended:
                del fds[fd]
                os.close(fd)
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def cleanup(proc: subprocess.Popen, *pids: int) -> None:
    for kill, target in [(os.killpg, proc.pid), *((os.kill, pid) for pid in pids)]:
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass
    proc.wait(10)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_killed_driver_leaves_none_of_its_session_and_spares_the_rest(tmp_path):
    proc, session = start_driver(tmp_path, "kill")
    state = json.loads(proc.stdout.readline())
    pids, watchdog = state["pids"], state["watchdog"]
    try:
        ours = [pids[name] for name in state["ours"]]
        theirs = {name: pid for name, pid in pids.items() if name not in state["ours"]}
        assert all(reaper.start_time(pid) is not None for pid in ours)  # the watchdog waits for the driver
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        left = wait_gone([*ours, watchdog], timeout=2 * GRACE_S + 20)
        assert left == [], f"outlived the driver and its watchdog: {left}"
        alive = {name: reaper.start_time(pid) is not None for name, pid in theirs.items()}
        assert alive == dict.fromkeys(theirs, True), "the watchdog ended a process not of its session"
        log = (session / "logs" / reaper.LOG_NAME).read_text()  # "HH:MM:SS pid name signal" a line
        signalled = {(int(line.split()[1]), line.split()[-1]) for line in log.splitlines()[1:]}
        expected = {(pids[name], "SIGTERM") for name in state["ours"]} | {(pids["stubborn"], "SIGKILL")}
        assert signalled == expected, log
    finally:
        cleanup(proc, watchdog, *pids.values())


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_after_a_normal_shutdown_the_watchdog_exits_quietly(tmp_path):
    proc, session = start_driver(tmp_path, "normal")
    try:
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert json.loads(out) == {"watchdog": 0}  # waited for by close(): it has exited, status 0
        assert not (session / "logs" / reaper.LOG_NAME).exists()  # it signalled nothing
    finally:
        cleanup(proc)
