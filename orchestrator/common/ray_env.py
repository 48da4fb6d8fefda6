"""What every Ray of phasesweep's shares, whether ray.init starts it (orchestrator/run/ray_session.py)
or `ray start` (scripts/cluster.sh): its environment, its auth token, a temp folder short enough
for its socket paths, and how its errors read. Stdlib only: the cluster scripts and Ray's workers
import it without the driver's modules."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

AUTH_ENV = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}  # token auth, no usage stats
# workers at niceness 0: Ray's default 15 lets any other process on the machine preempt a capture or benchmark
WORKER_ENV = {"RAY_worker_niceness": "0"}
# a node on 127.0.0.1 stays on loopback (with _node_ip_address alone Ray resolves 127.0.0.1 to the routable IP)
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOCAL_ENV = {**LOOPBACK_ENV, **AUTH_ENV, **WORKER_ENV}  # a local Ray's, read by Ray at import

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of Ray's worker headers

SOCKET_PATH_MAX = 107  # AF_UNIX; Ray's sockets lie under <temp folder>/session_<date>_<pid>/sockets/
RAY_SOCKET_TAIL = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")


def ensure_auth_token(env: dict[str, str] | None = None) -> None:
    """The token a Ray started outside ray.init needs (`ray start`, a test's cluster; ray.init
    makes its own): ~/.ray/auth_token, made by Ray's CLI when there is none."""
    ray_cli = Path(sys.executable).with_name("ray")
    env = env if env is not None else {**os.environ, **LOCAL_ENV}
    subprocess.run([str(ray_cli), "get-auth-token", "--generate"], env=env, check=True, capture_output=True)


def socket_safe(folder: Path, below: int) -> Path:
    """`folder`, or the folder of its name in /tmp where Ray's socket paths (`below` more
    characters under it, then its session's) would pass AF_UNIX's limit."""
    if len(str(folder)) + below + RAY_SOCKET_TAIL <= SOCKET_PATH_MAX:
        return folder
    return Path("/tmp") / folder.name


def root_cause(e: BaseException) -> tuple[str, str]:
    """(one line naming the root cause, the full text) of a Ray error: a task's own
    exception rather than Ray's coloured worker header."""
    cause = getattr(e, "cause", None) or e
    text = ANSI.sub("", str(cause)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first = lines[-1] if cause is not e and lines else (lines[0] if lines else "")
    return f"{type(cause).__name__}: {first}"[:500], ANSI.sub("", str(e))
