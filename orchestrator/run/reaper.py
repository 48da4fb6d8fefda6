"""A watchdog that ends what a dead driver's local Ray leaves behind (stdlib only).

Ray's own processes die with the driver (PR_SET_PDEATHSIG), but the raylet's two agents
report its death to the dead GCS first and wait out a 60 s timeout. So the driver starts this
watchdog (`watch`) in a session of its own, with a pipe on its stdin: at EOF (the driver
exited, however) it ends every live process of that Ray session, SIGTERM then SIGKILL.

A process is of the session, and only then touched, when it started after the driver and its
command line names the session's folder, or it carries a Ray title (ray::..., Ray overwrites
its command line) and holds a file open in that folder. Signals go through a pidfd opened
before the process is checked again, so a reused pid is not hit.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

GRACE_S = 5.0  # from SIGTERM to SIGKILL, and from SIGKILL to giving up
POLL_S = 0.1
RAY_TITLES = ("ray::", "ray-dashboard-")
LOG_NAME = "phasesweep_reaper.log"  # under <session>/logs, written only when something was ended
# Ray's autoscaler monitor, by its script (tests/test_scheduler.py finds it in a live local Ray)
AUTOSCALER_MONITOR = re.compile(r"/ray/autoscaler/_private/monitor\.py$")
RAYLET = re.compile(r"/ray/core/src/ray/raylet/raylet$")


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks after boot, /proc/<pid>/stat field 22); None when
    it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # from field 3 (state) on: comm may hold spaces
    return None if rest[0] in ("Z", "X") else int(rest[19])


class Session:
    """Which processes belong to one Ray session (see the module's docstring)."""

    def __init__(self, session_dir: str, since: int, spare: Iterable[int] = ()):
        dirs = {os.path.abspath(session_dir), os.path.realpath(session_dir)}
        self.dirs = tuple(d + "/" for d in dirs)
        # the directory's name, not a longer one that starts with it (session_..._123 vs _1234)
        self.named = re.compile("|".join(re.escape(d) for d in dirs) + r"(?![\w.-])")
        self.since = since
        self.spare = {os.getpid(), *spare}  # this watchdog (its command line names the directory), the driver

    def holds(self, pid: int) -> bool:
        started = start_time(pid)
        if started is None or started < self.since or pid in self.spare:
            return False
        args = _args(pid)
        if not args:  # gone
            return False
        if any(self.named.search(a) for a in args):
            return True
        return args[0].startswith(RAY_TITLES) and self._has_open_file(pid)

    def _has_open_file(self, pid: int) -> bool:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours
            return False
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(self.dirs):
                    return True
            except OSError:
                continue
        return False

    def live(self) -> set[int]:
        return {int(entry) for entry in os.listdir("/proc") if entry.isdigit() and self.holds(int(entry))}

    def running(self, script: re.Pattern[str]) -> list[int]:
        """The live processes of the session whose command line runs a file `script` matches."""
        return [pid for pid in sorted(self.live()) if any(script.search(a) for a in _args(pid))]

    def signal(self, pid: int, sig: int) -> bool:
        """Send `sig` to `pid` if it still is of the session (checked through a pidfd)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            if not self.holds(pid):
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def reap(session: Session, grace_s: float = GRACE_S) -> list[str]:
    """End every live process of `session`: SIGTERM, then SIGKILL what is left after `grace_s`.
    Returns what it signalled ("HH:MM:SS pid name signal"), in order."""
    done: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace_s
        signalled: set[int] = set()
        while (left := session.live()) and time.monotonic() < deadline:
            for pid in sorted(left - signalled):  # one signal each; one started meanwhile gets its own
                name = _name(pid)
                if session.signal(pid, sig):
                    signalled.add(pid)
                    done.append(f"{time.strftime('%H:%M:%S')} {pid} {name} {sig.name}")
            time.sleep(POLL_S)
        if not left:
            break
    return done


def _args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _name(pid: int) -> str:
    return (_args(pid) or ["?"])[0][:80]


# -- the driver's side ----------------------------------------------------------------


class Watchdog:
    """The driver's end of the pipe. Keep it referenced while Ray runs: closing the pipe (or
    its being garbage-collected) is what sets the watchdog off."""

    def __init__(self, proc: subprocess.Popen, grace_s: float, session: Session):
        self.proc = proc
        self.grace_s = grace_s
        self.session = session

    def end_autoscaler(self) -> list[int]:
        """SIGKILL the local Ray's autoscaler monitor, before ray.shutdown(): Ray ends the GCS
        first, and the monitor answers SIGTERM by reporting to the GCS, so Ray waits its 1 s
        timeout on it at every shutdown. A local Ray of fixed size has no use for it. Returns
        the pids ended (none when Ray names the monitor otherwise: the shutdown waits then)."""
        return [pid for pid in self.session.running(AUTOSCALER_MONITOR) if self.session.signal(pid, signal.SIGKILL)]

    def raylet_gone(self) -> bool:
        """Whether the local Ray's raylet has died (killed, out of memory) while the driver ran."""
        return not self.session.running(RAYLET)

    def close(self) -> None:
        """After ray.shutdown(): the watchdog ends any straggler, then exits; waited for while
        it may (it exits at once when nothing is left)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(2 * self.grace_s + 5)
        except subprocess.TimeoutExpired:  # it finishes on its own
            pass


def watch(session_dir: str, grace_s: float = GRACE_S) -> Watchdog:
    """Start the watchdog of the Ray session in `session_dir`, which this process started."""
    since = start_time(os.getpid()) or 0  # every process of the session started after this one
    # -I -S: the standard library only, neither this folder's modules nor site-packages
    command = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), f"--grace={grace_s}", session_dir, str(since)]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,  # its write end is ours alone (not inherited: O_CLOEXEC)
        stdout=subprocess.DEVNULL,  # never the driver's pipes: a reader of those would wait for it
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )
    return Watchdog(proc, grace_s, Session(session_dir, since))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="End a Ray session's processes once stdin reaches EOF.")
    parser.add_argument("session_dir")
    parser.add_argument("since", type=int, help="the driver's start time, /proc/<pid>/stat field 22")
    parser.add_argument("--grace", type=float, default=GRACE_S, help="seconds from SIGTERM to SIGKILL")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is the driver's
    session = Session(args.session_dir, args.since, spare=[os.getppid()])
    while sys.stdin.buffer.read(65536):  # nothing is ever written: this waits for EOF
        pass
    done = reap(session, args.grace)
    if done:
        try:
            with open(os.path.join(args.session_dir, "logs", LOG_NAME), "a") as log:
                log.write(f"{time.strftime('%Y-%m-%d')}: the driver is gone; what of its Ray session was left:\n")
                log.writelines(f"{line}\n" for line in done)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
