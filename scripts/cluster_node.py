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
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its sibling modules, also when loaded by path (tests)
from node_health import LOGS, WAIT_S, end, http_get, last_error, node_processes, wait_up  # noqa: E402
from node_ports import NotUp, Refused, base, port_args  # noqa: E402

from orchestrator.common.ray_env import AUTH_ENV, LOOPBACK_ENV, WORKER_ENV, ensure_auth_token  # noqa: E402

BENCH = '{"phasesweep_bench": 1}'
USAGE = (
    "usage: scripts/cluster.sh head [NODE_IP] [--bench] [--cache DIR] [--num-cpus N] [--port P] [--dashboard-port P] "
    "[-- RAY START ARGS] | worker HEAD_IP:PORT [--cache DIR] [--num-cpus N] [--node-ip IP] [-- RAY START ARGS] "
    "| stop [NAME|FOLDER]"
)


def start(kind: str, opts: dict) -> int:
    ip, extra = opts["ip"], opts["extra"]
    os.environ.update(AUTH_ENV)  # for this process's GcsClient too
    ray_env = {**WORKER_ENV, **os.environ}
    if opts.get("cache"):
        Path(opts["cache"]).mkdir(parents=True, exist_ok=True)
        ray_env["PHASESWEEP_NODE_CACHE"] = str(Path(opts["cache"]).resolve())
    given = {k: v for k, v in (("gcs", opts.get("port")), ("dashboard", opts.get("dashboard_port"))) if v is not None}
    args, ports = port_args(kind, given, extra)
    cmd = ["ray", "start"]
    if kind == "head":
        if ip == "127.0.0.1":  # a cluster on 127.0.0.1 stays on loopback (Ray otherwise binds every interface)
            ray_env.update(LOOPBACK_ENV)
        ensure_auth_token(ray_env)
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
    env = {"RAY_AUTH_MODE": AUTH_ENV["RAY_AUTH_MODE"], **(LOOPBACK_ENV if ip == "127.0.0.1" else {})}
    return " ".join(f"{k}={v}" for k, v in env.items())


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