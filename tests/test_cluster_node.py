"""scripts/cluster.sh (scripts/cluster_node.py, node_ports.py, node_health.py) without Ray: the
ports `ray start` is given, the arguments it refuses, and stop's scope (only the processes of
the node folders it names)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, in_session

spec = importlib.util.spec_from_file_location("cluster_node", ROOT / "scripts" / "cluster_node.py")
node = importlib.util.module_from_spec(spec)
spec.loader.exec_module(node)  # puts scripts/ on sys.path for its siblings
import node_health  # noqa: E402
import node_ports  # noqa: E402


def test_ports_are_free_unless_given_and_ray_start_args_win():
    picked = iter(range(20000, 20100))
    args, ports = node_ports.port_args(
        "head",
        {"gcs": 6400, "dashboard": "8300"},
        ["--node-manager-port", "7000", "--num-gpus=0"],
        pick=lambda n: [next(picked) for _ in range(n)],
    )
    assert set(ports) == set(node_ports.PORTS)  # every port the head opens is named
    assert (ports["gcs"], ports["dashboard"], ports["node_manager"]) == (6400, 8300, 7000)
    assert len(set(ports.values())) == len(ports)  # no port twice
    assert "--port=6400" in args and "--dashboard-port=8300" in args
    assert not any(a.startswith("--node-manager-port") for a in args)  # the user's own flag goes through as given
    assert f"--dashboard-agent-listen-port={ports['agent_listen']}" in args


def test_a_worker_gets_no_head_ports_and_real_free_ones():
    args, ports = node_ports.port_args("worker", {}, [])
    assert not {"gcs", "dashboard", "ray_client"} & set(ports)
    assert len(set(ports.values())) == len(ports) == len(args)
    for port in ports.values():  # free now
        with __import__("socket").socket() as s:
            s.bind(("", port))


@pytest.mark.parametrize(
    "argv, says",
    [
        (["head", "--", "--temp-dir=/tmp/x"], "--temp-dir is scripts/cluster.sh's own"),
        (["head", "--", "--object-manager-port", "many"], "--object-manager-port 'many' is not a port"),
        (["worker"], "usage:"),
        (["worker", "h:1", "--port", "1"], "usage:"),
        (["head", "--bogus"], "usage:"),
        (["stop", "not-a-node"], "no node 'not-a-node' of scripts/cluster.sh"),
        (["restart"], "usage:"),
    ],
)
def test_refused_arguments_say_why_in_one_line(argv, says, capsys):
    assert node.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


@pytest.fixture
def short_tmp(monkeypatch):
    """A TMPDIR of the test's own (the node base under it), short like Ray needs."""
    folder = tempfile.mkdtemp(prefix="psw-t", dir="/tmp")
    monkeypatch.setenv("TMPDIR", folder)
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def fake_node(folder: Path) -> tuple[subprocess.Popen, int]:
    """A process naming `folder` in a session of its own, with a child that names nothing (as
    Ray's agents and workers): (the process, its child's pid)."""
    folder.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys,time; print(subprocess.Popen(['sleep', '600']).pid, flush=True); time.sleep(600)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = int(proc.stdout.readline())
    (folder / "node.json").write_text(json.dumps({"sid": proc.pid}))
    return proc, child


def test_a_node_base_too_long_for_rays_socket_paths_moves_to_tmp(monkeypatch, tmp_path):
    """The rule a local Ray's temp folder follows too (orchestrator/common/ray_env.py socket_safe)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / ("d" * 80)))
    assert node_ports.base() == Path("/tmp") / f"psw-ray-{os.getuid()}"
    monkeypatch.setenv("TMPDIR", "/tmp/short")
    assert node_ports.base() == Path("/tmp/short") / f"psw-ray-{os.getuid()}"


def test_stop_ends_only_the_named_nodes_processes(short_tmp):
    base = node.base()
    assert base.parent == short_tmp
    a, a_child = fake_node(base / "head-1234")
    b, b_child = fake_node(base / "worker-abc123")
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)  # another Ray of the machine, say
    try:
        env = {**os.environ, "TMPDIR": str(short_tmp)}
        out = subprocess.run(
            [sys.executable, "scripts/cluster_node.py", "stop", "head-1234"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        assert "stopped head-1234: 2 processes ended" in out.stdout
        assert a.wait(timeout=10) is not None and in_session(a.pid) == []  # the process and its child
        assert not (base / "head-1234").exists()
        assert b.poll() is None and Path(f"/proc/{b_child}").exists() and other.poll() is None
        out = subprocess.run(
            [sys.executable, "scripts/cluster_node.py", "stop"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert "stopped worker-abc123: 2 processes ended" in out.stdout and b.wait(timeout=10) is not None
        assert other.poll() is None and list(base.iterdir()) == []
        assert a_child not in [int(p.split()[0]) for p in in_session(a.pid)]
    finally:
        for p in (a, b, other):
            p.kill()
        other.wait()


@pytest.fixture
def dashboard(monkeypatch):
    """A stand-in for a head's dashboard: its node list, for the token only; (url, the list)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0ken")
    nodes = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/nodes?view=summary" and self.headers.get("Authorization") == "Bearer t0ken"
            body = json.dumps({"data": {"summary": [{"raylet": n} for n in nodes]}}).encode()
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(body if ok else b"")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = __import__("threading").Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", nodes
    server.shutdown()


def test_submit_finds_the_gcs_address_from_the_clusters_own_dashboard(dashboard):
    url, nodes = dashboard
    worker = {
        "isHeadNode": False,
        "state": "ALIVE",
        "nodeManagerAddress": "10.0.0.2",
        "tempDir": "/tmp/psw-ray-0/worker-abc123",
    }
    dead = {"isHeadNode": True, "state": "DEAD", "nodeManagerAddress": "10.0.0.9", "tempDir": "/tmp/psw-ray-0/head-1"}
    head = {
        "isHeadNode": True,
        "state": "ALIVE",
        "nodeManagerAddress": "10.0.0.1",
        "tempDir": "/tmp/psw-ray-0/head-6379",
    }
    nodes += [worker, dead, head]
    assert node.gcs_address(url + "/") == "10.0.0.1:6379"
    head["tempDir"] = "/tmp/ray"  # a head started by plain `ray start`
    with pytest.raises(
        node.Refused, match="was not started by scripts/cluster.sh .* PHASESWEEP_CLUSTER_ADDRESS=host:port"
    ):
        node.gcs_address(url)
    os.environ["RAY_AUTH_TOKEN"] = "wrong"
    with pytest.raises(node.Refused, match=r"did not list its nodes \(HTTP 401\)"):
        node.gcs_address(url)


def test_the_private_gcs_client_it_reads_is_the_verified_one():
    """registered() reads Ray's private GcsClient on the verified Ray only (else a public
    fallback): an upgrade of Ray fails here until the use is checked again."""
    import ray
    from ray._raylet import GcsClient, InnerGcsClient  # GcsClient forwards its calls to InnerGcsClient

    assert ray.__version__ == node_health.RAY_VERIFIED, f"Ray {ray.__version__}: check registered()'s GcsClient use, then RAY_VERIFIED"
    assert hasattr(GcsClient, "__getattr__") and callable(getattr(InnerGcsClient, "get_all_node_info", None))
