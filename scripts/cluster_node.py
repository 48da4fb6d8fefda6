"""The Ray nodes of scripts/cluster.sh: each in a folder of its own, on free ports, checked up; stop
ends only them.

Each node's Ray temp folder is <base>/head-<GCS port> or <base>/worker-<random>, base being
${TMPDIR:-/tmp}/psw-ray-<uid> (/tmp/psw-ray-<uid> where that is too long for Ray's socket paths).
`ray start` runs in a session of its own, which every process of the node inherits; node.json in
the folder keeps that session, the node's addresses, ports and id. Ray's default temp folder
(/tmp/ray, whose ray_current_cluster any `ray start --head` overwrites) is never used.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = '{"phasesweep_bench": 1}'
# Ray's socket paths lie under <folder>/session_<date>_<pid>/sockets/ (AF_UNIX allows 107 bytes)
SOCKET_TAIL = len("/worker-xxxxxx/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
WAIT_S = float(os.environ.get("PHASESWEEP_NODE_WAIT_S", "60"))  # how long a started node may take to be up
STOP_GRACE_S = 5.0  # SIGTERM's grace; raylet and gcs_server take longer only to end as killed anyway
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
USAGE = (
    "usage: scripts/cluster.sh head [NODE_IP] [--bench] [--cache DIR] [--num-cpus N] [--port P] [--dashboard-port P] "
    "[-- RAY START ARGS] | worker HEAD_IP:PORT [--cache DIR] [--num-cpus N] [--node-ip IP] [-- RAY START ARGS] "
    "| stop [NAME|FOLDER]"
)


class Refused(Exception):
    """One line for the user; the script exits 2."""


class NotUp(Refused):
    """A node that did not start; the script exits 1."""


def base() -> Path:
    """This user's folder of node folders: short enough for Ray's socket paths."""
    name = f"psw-ray-{os.getuid()}"
    tmp = Path(os.environ.get("TMPDIR") or "/tmp") / name
    return tmp if len(str(tmp)) + SOCKET_TAIL <= 107 else Path("/tmp") / name


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


# -- processes ----------------------------------------------------------------------------------


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


# -- start --------------------------------------------------------------------------------------


def token() -> str:
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    return os.environ.get("RAY_AUTH_TOKEN") or Path(path).read_text().strip()


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


def start(kind: str, opts: dict) -> int:
    ip, extra = opts["ip"], opts["extra"]
    os.environ.update(RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0")  # for this process's GcsClient too
    ray_env = dict(os.environ)
    if opts.get("cache"):
        Path(opts["cache"]).mkdir(parents=True, exist_ok=True)
        ray_env["PHASESWEEP_NODE_CACHE"] = str(Path(opts["cache"]).resolve())
    given = {k: v for k, v in (("gcs", opts.get("port")), ("dashboard", opts.get("dashboard_port"))) if v is not None}
    args, ports = port_args(kind, given, extra)
    cmd = ["ray", "start"]
    if kind == "head":
        if ip == "127.0.0.1":  # a cluster on 127.0.0.1 stays on loopback (Ray otherwise binds every interface)
            ray_env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        subprocess.run(["ray", "get-auth-token", "--generate"], env=ray_env, check=True, stdout=subprocess.DEVNULL)
        name = f"head-{ports['gcs']}"
        cmd += ["--head", f"--dashboard-host={ip}"]
        gcs = f"{ip}:{ports['gcs']}"
    else:
        name, gcs = f"worker-{secrets.token_hex(3)}", opts["head"]
        cmd += [f"--address={gcs}", f"--resources={BENCH}"]
        if ip == "127.0.0.1":  # beside a head at 127.0.0.1: every address kept on loopback
            cmd = [sys.executable, str(HERE / "ray_loopback.py"), "start", f"--address={gcs}", f"--resources={BENCH}"]
    folder = base() / name
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        raise Refused(
            f"{folder} exists: a node {name} of this user runs here; scripts/cluster.sh stop {name} first"
        ) from None
    cmd += [f"--temp-dir={folder}", f"--node-ip-address={ip}", *args, *opts["resources"], *opts["cpus"], *extra]
    node = {"kind": kind, "name": name, "folder": str(folder), "ip": ip, "gcs_address": gcs, "ports": ports}
    if kind == "head":
        node["dashboard_url"] = f"http://{ip}:{ports['dashboard']}"
    # in a session of its own, which every process of the node inherits: stop finds them by it
    with open(folder / "ray_start.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env=ray_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        node["sid"] = proc.pid
        write(folder, node)
        try:
            rc = proc.wait(timeout=max(300.0, WAIT_S))
        except subprocess.TimeoutExpired:
            rc = None
    failed = None
    if rc != 0:  # None too
        why = f"`ray start` exited {rc}" if rc is not None else "`ray start` did not return"
        failed = ("ray start", why, folder / "ray_start.log")
    else:
        down = wait_up(node, folder, time.monotonic() + WAIT_S)
        if down:
            failed = (down[0], f"{down[1]} after {WAIT_S:.0f} s", folder / "session_latest" / "logs" / LOGS[down[0]])
    if failed:
        _, why, log_path = failed
        quoted = f"{log_path.relative_to(folder)}: {last_error(log_path)}"
        left = end(node_processes(folder, node["sid"]))
        shutil.rmtree(folder, ignore_errors=True)
        gone = f"stopped its processes{f' ({len(left)} still alive)' if left else ''} and removed {folder}"
        raise NotUp(f"{kind} {name} did not start: {why} ({quoted}); {gone}")
    write(folder, node)
    report(node, opts)
    return 0


def write(folder: Path, node: dict) -> None:
    (folder / "node.json").write_text(json.dumps(node, indent=1) + "\n")


def cli_env(ip: str) -> str:
    """What the Ray CLI needs in its environment for this cluster (on loopback Ray would otherwise
    turn 127.0.0.1 into the machine's routable address, where nothing listens)."""
    return "RAY_AUTH_MODE=token" + (" RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" if ip == "127.0.0.1" else "")


def report(node: dict, opts: dict) -> None:
    gcs, folder = node["gcs_address"], node["folder"]
    print(f"{node['name']} is up: node {node['node_id']}, folder {folder} (logs in session_latest/logs)")
    if node["kind"] == "head":
        url = node["dashboard_url"]
        print(f"GCS address:   {gcs}    workers: scripts/cluster.sh worker {gcs}")
        print(f"dashboard:     {url}    submit: scripts/submit.sh {url} -m ... tracking=server tracking.uri=http://...")
        print(f"Ray CLI:       {cli_env(node['ip'])} ray status --address={gcs}")
        if not opts["resources"]:
            print("the head offers no benchmark slot: start workers, or restart it with --bench")
    else:
        print(f"joined the GCS at {gcs}")
    print(f"stop it with:  scripts/cluster.sh stop {node['name']}")


# -- stop ---------------------------------------------------------------------------------------


def nodes_named(which: str | None) -> list[Path]:
    root = base()
    if which is None:
        return sorted(p for p in root.glob("*") if p.is_dir() and re.fullmatch(r"(head|worker)-\w+", p.name))
    folder = Path(which) if "/" in which else root / which
    if not folder.is_dir() or not re.fullmatch(r"(head|worker)-\w+", folder.name):
        raise Refused(f"no node {which!r} of scripts/cluster.sh (its nodes are the folders under {root})")
    return [folder.resolve()]


def stop(which: str | None) -> int:
    folders = nodes_named(which)
    if not folders:
        print(f"no node of scripts/cluster.sh is running for this user (none under {base()})")
        return 0
    stuck = 0
    for folder in folders:
        try:
            sid = json.loads((folder / "node.json").read_text()).get("sid")
        except (OSError, ValueError):
            sid = None
        pids = node_processes(folder, sid)
        left = end(pids)
        if left:
            stuck += 1
            print(f"{folder.name}: {len(left)} of its processes did not end ({left}); kept {folder}")
            continue
        shutil.rmtree(folder, ignore_errors=True)
        print(f"stopped {folder.name}: {len(pids)} processes ended, {folder} removed")
    return 1 if stuck else 0


# -- submit.sh's GCS address ----------------------------------------------------------------------


def gcs_address(dashboard_url: str) -> str:
    """The GCS address of the cluster whose dashboard is `dashboard_url`, from the cluster itself:
    its head node's IP, and the port its folder is named after (head-<GCS port>)."""
    url = dashboard_url.rstrip("/")
    status, body = http_get(f"{url}/nodes?view=summary", timeout=10)
    if status != 200:
        why = f"HTTP {status}" if status else "no answer"
        raise Refused(
            f"the dashboard at {url} did not list its nodes ({why}); is the head up and ~/.ray/auth_token its token?"
        )
    for n in json.loads(body)["data"]["summary"]:
        raylet = n.get("raylet", {})
        if raylet.get("isHeadNode") and raylet.get("state") == "ALIVE":
            m = re.fullmatch(r"head-(\d+)", Path(raylet.get("tempDir", "")).name)
            if m:
                return f"{raylet['nodeManagerAddress']}:{m.group(1)}"
            raise Refused(
                f"the head at {url} was not started by scripts/cluster.sh (its folder {raylet.get('tempDir')} names no GCS port): "
                "give its GCS address as PHASESWEEP_CLUSTER_ADDRESS=host:port"
            )
    raise Refused(f"the dashboard at {url} lists no live head node")


# -- command line -------------------------------------------------------------------------------


def parse(argv: list[str]) -> tuple[str, dict]:
    if not argv:
        raise Refused(USAGE)
    cmd, rest = argv[0], argv[1:]
    opts = {"ip": "127.0.0.1", "head": None, "resources": [], "cpus": [], "extra": [], "which": None}
    i = 0
    while i < len(rest):
        a = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) else None
        if a == "--":
            opts["extra"] = rest[i + 1 :]
            break
        if a == "--bench" and cmd == "head":
            opts["resources"] = [f"--resources={BENCH}"]
            i += 1
            continue
        flags = {
            "--cache": "cache",
            "--num-cpus": "num_cpus",
            "--port": "port",
            "--dashboard-port": "dashboard_port",
            "--node-ip": "ip",
        }
        if a in flags and value is not None and cmd in ("head", "worker"):
            if a in ("--port", "--dashboard-port") and cmd != "head":
                raise Refused(USAGE)
            opts[flags[a]] = value
            i += 2
            continue
        if a.startswith("-"):
            raise Refused(USAGE)
        if cmd == "worker" and opts["head"] is None:
            opts["head"] = a
        elif cmd == "stop" and opts["which"] is None:
            opts["which"] = a
        elif cmd == "head":
            opts["ip"] = a
        else:
            raise Refused(USAGE)
        i += 1
    if opts.get("num_cpus"):
        opts["cpus"] = [f"--num-cpus={opts['num_cpus']}"]
    if cmd not in ("head", "worker", "stop") or (cmd == "worker" and not opts["head"]):
        raise Refused(USAGE)
    return cmd, opts


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["gcs-address"] and len(argv) == 2:  # scripts/submit.sh's
            print(gcs_address(argv[1]))
            return 0
        cmd, opts = parse(argv)
        if cmd == "stop":
            return stop(opts["which"])
        return start(cmd, opts)
    except Refused as e:
        print(f"scripts/cluster.sh: {e}", file=sys.stderr)
        return 1 if isinstance(e, NotUp) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
