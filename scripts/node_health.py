"""scripts/cluster.sh's processes and readiness: a node's processes (by its folder and session),
ending them, and waiting until its GCS, raylet, dashboard and agent are up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from node_ports import Refused, listens

WAIT_S = float(os.environ.get("PHASESWEEP_NODE_WAIT_S", "60"))  # how long a started node may take to be up
STOP_GRACE_S = 5.0  # SIGTERM's grace; raylet and gcs_server take longer only to end as killed anyway


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (session id, command line)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        rest = text[text.rindex(")") + 2 :].split()
        if rest[0] not in ("Z", "X"):
            found[int(stat.parent.name)] = (int(rest[3]), cmd)
    return found


def node_processes(folder: Path, sid: int | None) -> list[int]:
    """A node's processes: those whose command line names its folder, and every process of their
    sessions and of the session `ray start` ran in (Ray's agents, workers and client server name
    no folder), never this script's own session."""
    procs = processes()
    mine = os.getsid(0)
    named = {pid for pid, (_, cmd) in procs.items() if re.search(re.escape(str(folder)) + r"(/|\s|$)", cmd)}
    sessions = {procs[p][0] for p in named} | ({sid} if sid else set())
    sessions.discard(mine)
    return sorted(p for p, (s, _) in procs.items() if (p in named or s in sessions) and p != os.getpid() and s != mine)


def end(pids: list[int], grace: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after `grace`; what is still alive after that (normally nothing)."""
    alive = lambda: [p for p in pids if Path(f"/proc/{p}").exists() and not zombie(p)]  # noqa: E731
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for p in alive():
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    return alive()


def zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2] in "ZX"


def token() -> str:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip()
    except OSError as e:
        raise Refused(
            f"no Ray auth token at {path} ({e.strerror}): copy the head's ~/.ray/auth_token here, "
            "or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
        ) from None


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token()}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, ValueError):
        return 0, b""


RAY_VERIFIED = "2.60.0"  # the Ray whose private GcsClient registered() reads; tests/test_cluster_node.py checks


def registered(gcs: str, folder: Path, pids: list[int], port: int) -> str | None:
    """The id of the ALIVE node the GCS at `gcs` knows with `folder` as its temp folder, or None.
    On the verified Ray: its GcsClient, what `ray status` itself asks the GCS with (private, so
    guarded). Else, public: the node's raylet holds its node-manager port and `ray status` answers."""
    import ray

    if ray.__version__ == RAY_VERIFIED:
        try:
            from ray._raylet import GcsClient

            infos = GcsClient(address=gcs).get_all_node_info(timeout=5).values()
        except ImportError:
            infos = None
        except Exception:
            return None
        if infos is not None:
            for info in infos:
                if info.state == 0 and info.temp_dir == str(folder):  # GcsNodeState ALIVE
                    return info.node_id.hex()
            return None
    if not listens(pids, port):
        return None
    status = subprocess.run(["ray", "status", f"--address={gcs}"], capture_output=True, timeout=60, env={**os.environ, "RAY_AUTH_MODE": "token"})
    return "registered (node id unknown)" if status.returncode == 0 else None


LOGS = {  # what each check's failure points at, in the session's logs folder
    "gcs": "gcs_server.out",
    "raylet": "raylet.out",
    "dashboard": "dashboard.log",
    "agent": "dashboard_agent.log",
}


def last_error(path: Path) -> str:
    """The last line of a log that says error or failed (else its last line), trimmed."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"{path} unreadable"
    bad = [ln for ln in lines if re.search(r"error|fail|exception|refused", ln, re.I) and "[state-dump]" not in ln]
    line = (bad or lines or ["(empty)"])[-1]
    return re.sub(r"^\[?[\d\-: ,.]+\]?\s*(\w+\s+)?", "", line)[:240] if bad else line[:240]


def wait_up(node: dict, folder: Path, deadline: float) -> tuple[str, str] | None:
    """Wait until the node is up: None, or (what is not up, why) at the deadline."""
    ip, ports = node["ip"], node["ports"]
    gcs = node["gcs_address"]
    while True:
        pids = node_processes(folder, node["sid"])
        pending = []
        if node["kind"] == "head" and not listens(pids, ports["gcs"]):
            pending.append(("gcs", f"the GCS is not listening on {gcs}"))
        if not node.get("node_id"):
            node["node_id"] = registered(gcs, folder, pids, ports["node_manager"])
            if not node["node_id"]:
                pending.append(("raylet", f"the raylet has not registered with the GCS at {gcs}"))
        if node["kind"] == "head":
            url = node["dashboard_url"]
            if not listens(pids, ports["dashboard"]) or http_get(f"{url}/api/version")[0] != 200:
                pending.append(("dashboard", f"the dashboard is not answering at {url}"))
        if not listens(pids, ports["agent_listen"]):
            pending.append(("agent", f"the dashboard agent is not listening on {ip}:{ports['agent_listen']}"))
        if not pending:
            return None
        if time.monotonic() > deadline:
            return pending[0]
        time.sleep(1.0)
