"""scripts/cluster.sh's ports and folders: each node's Ray temp folder under this user's base, the
ports `ray start` is given (free unless given), and whether a node's own processes listen on one."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, however the script is run
from orchestrator.common.ray_env import socket_safe  # noqa: E402

# every port `ray start` opens, by name: chosen free unless given (head-only ones marked)
PORTS = {
    "gcs": ("--port", True),
    "dashboard": ("--dashboard-port", True),
    "ray_client": ("--ray-client-server-port", True),
    "agent_listen": ("--dashboard-agent-listen-port", False),
    "agent_grpc": ("--dashboard-agent-grpc-port", False),
    "metrics_export": ("--metrics-export-port", False),
    "runtime_env_agent": ("--runtime-env-agent-port", False),
    "node_manager": ("--node-manager-port", False),
    "object_manager": ("--object-manager-port", False),
}


class Refused(Exception):
    """One line for the user; the script exits 2."""


class NotUp(Refused):
    """A node that did not start; the script exits 1."""


def base() -> Path:
    """This user's folder of node folders: short enough for Ray's socket paths."""
    return socket_safe(Path(os.environ.get("TMPDIR") or "/tmp") / f"psw-ray-{os.getuid()}", len("/worker-xxxxxx"))


def free_ports(n: int, host: str = "") -> list[int]:
    """n distinct ports free right now (held together while picked, so never the same twice)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` among `ray start` arguments (--flag=V or --flag V), or None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def port_args(kind: str, given: dict[str, int], extra: list[str], pick=free_ports) -> tuple[list[str], dict[str, int]]:
    """`ray start`'s port flags for a node of `kind` and every port by name: a port in `extra`
    (the user's RAY START ARGS, passed on as they are) wins, then `given`, else a free one."""
    if flag_value(extra, "--temp-dir") is not None:
        raise Refused("--temp-dir is scripts/cluster.sh's own (each node's folder, which stop finds): leave it out")
    names = [n for n, (_, head_only) in PORTS.items() if kind == "head" or not head_only]
    chosen: dict[str, int] = {}
    for name in names:
        value = flag_value(extra, PORTS[name][0])
        if value is not None or name in given:
            try:
                chosen[name] = int(value if value is not None else given[name])
            except ValueError:
                raise Refused(f"{PORTS[name][0]} {value!r} is not a port") from None
    free = iter(p for p in pick(len(names) + len(chosen)) if p not in chosen.values())
    for name in names:
        chosen.setdefault(name, next(free))
    args = [f"{PORTS[n][0]}={chosen[n]}" for n in names if flag_value(extra, PORTS[n][0]) is None]
    return args, {n: chosen[n] for n in names}


def listeners(port: int) -> set[int]:
    """Inodes of the TCP sockets listening on `port` (any address)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(f[9]))
    return inodes


def listens(pids: list[int], port: int) -> bool:
    """Whether one of `pids` holds a socket listening on `port` (not merely: something does)."""
    inodes = {f"socket:[{i}]" for i in listeners(port)}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return True
            except OSError:
                pass
    return False
