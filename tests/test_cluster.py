"""phasesweep on a real Ray cluster of several nodes.

- The placement rules on a multi-node cluster (ray.cluster_utils.Cluster, in this process):
  cuda benchmarks only on GPU nodes, one CPU benchmark per node at a time, and CPU
  benchmarks of two nodes side by side.
- The README's cluster section as written, on this machine: the tracking server on
  PostgreSQL with auth (scripts/mlflow_server.sh), a head and a worker started with
  `ray start` (scripts/cluster.sh, token auth on), each node with its own export cache and no
  shared one, and the mission's command submitted with `ray job submit` (scripts/submit.sh).
  What arrived is read back through MLflow's REST API; every process the test started is
  gone after the stop.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import FAST_OVERRIDES, ROOT, in_session
from tests.hub_server import tiny_llama_hub
from tests.test_tracking_server import credentials, free_port, rest

pytestmark = pytest.mark.slow


# -- placement on several nodes (ray.cluster_utils) ----------------------------------------


def _where():
    """A remote function that holds its slot half a second: (node id, start, end)."""
    import ray

    @ray.remote
    def where(_spec, _timeout_s=None, _forks=None, _packed=None):
        start = time.time()
        time.sleep(0.5)
        return ray.get_runtime_context().get_node_id(), start, time.time()

    return where


@pytest.fixture(scope="module")
def three_nodes():
    """Two CPU nodes with a bench slot each and a GPU node (its GPU declared, not real)."""
    from orchestrator.common.ray_env import LOCAL_ENV, ensure_auth_token
    from orchestrator.plan.placement import BENCH_RESOURCE

    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    ensure_auth_token()  # its GCS aborts without one (Check failed: has_token) on a machine that never ran Ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {BENCH_RESOURCE: 1}, "include_dashboard": False},
    )
    cpu2 = cluster.add_node(num_cpus=2, resources={BENCH_RESOURCE: 1})
    gpu = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    yield cluster, {"cpu": {cluster.head_node.node_id, cpu2.node_id}, "gpu": gpu.node_id}
    cluster.shutdown()


def test_benchmarks_land_where_the_placement_rules_say(three_nodes):
    from orchestrator.plan.config import ClusterCfg
    from orchestrator.plan.placement import bench_request
    from orchestrator.run.scheduler import Scheduler

    cluster, nodes = three_nodes
    sched = Scheduler(ClusterCfg(address=cluster.address, fork_server=False))
    sched.start()
    try:
        cap = sched.capacity
        assert (cap.bench_slots, cap.cpus, cap.gpus, cap.total_cpus) == (2, 2, 1, 5)
        cpu = bench_request(cap, "cpu", 1, {}, weight_bytes=0, memory_factor=1.5, max_retries=0)
        cuda = bench_request(cap, "cuda", 1, {}, weight_bytes=0, memory_factor=1.5, max_retries=0)
        for i in range(4):
            sched.submit("bench", f"cpu{i}", SimpleNamespace(export_dir=f"e{i}"), cpu)
        for i in range(2):
            sched.submit("bench", f"cuda{i}", SimpleNamespace(export_dir=f"g{i}"), cuda)
        sched._remote["bench"] = _where()
        done = {key: result for kind, key, result in sched.results() if kind == "bench"}
    finally:
        sched.stop()
    assert len(done) == 6
    assert {done[f"cuda{i}"][0] for i in range(2)} == {nodes["gpu"]}  # cuda only where the GPU is
    on = {}
    for i in range(4):
        node, start, end = done[f"cpu{i}"]
        assert node in nodes["cpu"]  # never on the node without a bench slot
        on.setdefault(node, []).append((start, end))
    for spans in on.values():  # one CPU benchmark per node at a time
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans


def test_a_remeasurement_on_a_cluster_is_a_task_placed_like_a_benchmark(three_nodes, tmp_path, mlflow_db, monkeypatch, caplog):
    """compare --remeasure --cluster: each variant's re-measurement is a Ray task asking for
    what its recorded benchmark asked (a bench slot and a whole bench node's CPUs), so it runs
    on a node with a bench slot, never on the GPU node. The task's timing itself is the
    local path's (tests/test_verdict.py); here it reports where it ran."""
    import logging

    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from orchestrator.run import entries
    from orchestrator.run.remeasure import remeasure
    from tasks.paired import PairOptions
    from tests.test_verdict import compose

    cluster, nodes = three_nodes
    uri = mlflow_db(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("remeasure-on-a-cluster")
    names = ["llama_decode_onnxruntime_cpu", "phi3_decode_onnxruntime_cpu"]
    sides: dict[str, dict] = {"baseline": {}, "candidate": {}}
    for side in sides:
        for name in names:
            run = client.create_run(exp, run_name=name)
            config = compose([f"model={name.split('_')[0]}", "phase=decode", "device=cpu", *FAST_OVERRIDES])
            client.log_text(run.info.run_id, OmegaConf.to_yaml(config), "config.yaml")
            sides[side][name] = client.get_run(run.info.run_id)

    def where(spec, _timeout_s, _forks):  # stands in for the timing: what it was given, and where
        import ray

        from tasks.paired import PairResult

        return PairResult(spec.name, ok=True, ratios=[1.0] * 6, ratio=1.0, ci=(1.0, 1.0), node=ray.get_runtime_context().get_node_id())

    monkeypatch.setattr(entries, "remeasure_entry", where)
    caplog.set_level(logging.INFO, logger="phasesweep")
    pairs, missed = remeasure(client, sides["baseline"], sides["candidate"], PairOptions(), cluster=cluster.address, uri=uri)
    assert not missed and sorted(pairs) == names
    assert {pairs[n]["node"] for n in names} <= nodes["cpu"]  # a bench node each, never the GPU node
    for name in names:
        assert f"{name}: queued on {cluster.address}, placed as its benchmark" in caplog.text
        assert f"{name}: ratio 1.000 [1.000, 1.000] from 6 rounds in 0 s on node {pairs[name]['node']}" in caplog.text
    assert caplog.text.count("'num_cpus': 2, 'resources': {'phasesweep_bench': 1}") == 2, caplog.text


# -- the README's cluster section, on loopback ----------------------------------------------

MISSION = ["-m", "model=llama,phi3", "phase=prefill,decode", "backend=onnxruntime,executorch", "device=cpu"]
# Each variant measured in two processes (bench.repeats=2), so that benchmarks run on both
# nodes by construction, not by timing: the node that makes the last export is free for its
# two benchmarks, one of which it gets (the other node is busy, or both are free and two
# benchmarks at once take both nodes' bench slots); the other node, free first, took the
# benchmarks ready before. A variant's run lists the node of each of its processes where
# they differ. With one benchmark per variant, fast benchmarks on one node could all end
# while the other was still making an ExecuTorch export (seen twice).
REPEATS = 2
SUBMITTED_BENCH = [*(o for o in FAST_OVERRIDES if not o.startswith("bench.repeats=")), f"bench.repeats={REPEATS}"]
VARIANTS = {
    f"{m}_{p}_{b}_cpu" for m in ("llama", "phi3") for p in ("prefill", "decode") for b in ("onnxruntime", "executorch")
}
# a Hugging Face id served by a local Hub (tests/hub_server.py), resolved by each node on its own
HUB_ID, HUB_EXPERIMENT = "phasesweep-test/Tiny-Llama", "hub-id"
HUB_SWEEP = ["-m", f"model.checkpoint={HUB_ID}", "phase=prefill,decode", "backend=onnxruntime", f"tracking.experiment={HUB_EXPERIMENT}"]
needs_postgres = pytest.mark.skipif(
    not glob.glob("/usr/lib/postgresql/*/bin/initdb"),
    reason="needs Debian's postgresql package (apt-get install postgresql; .ci/run installs it)",
)


def run(
    cmd: list[str], env: dict[str, str], timeout: float = 300, session: bool = False
) -> subprocess.CompletedProcess:
    """A script as a user runs it; `session`: in a session of its own (what it starts stays there)."""
    return subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, start_new_session=session
    )


class LoopbackCluster:
    """A tracking server and a Ray cluster on 127.0.0.1 started by scripts/cluster.sh, each node
    with its own export cache, and stopped by it, node by node (`ray stop` would end every Ray of
    the machine, another test's too). `user`: another LoopbackCluster of the same user (its HOME,
    token, node base and tracking server), a second cluster beside it."""

    def __init__(self, folder: Path, user: LoopbackCluster | None = None):
        self.folder, self.user = folder, user
        folder.mkdir(parents=True, exist_ok=True)
        self.sessions: list[int] = []  # the scripts' own, in case they leave anything
        self.nodes: dict[str, dict] = {}  # name -> its node.json
        self.stopped: set[str] = set()
        if user is None:
            clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING_", "RAY_"))}
            path = f"{Path(sys.executable).parent}{os.pathsep}{clean.get('PATH', '')}"  # the venv's python and ray
            # TMPDIR: the nodes' folders under a base of the test's own, short for Ray's sockets
            self.tmp = Path(tempfile.mkdtemp(prefix="psw-c", dir="/tmp"))
            self.env = {
                **clean,
                "PATH": path,
                "PYTHON": sys.executable,
                "HOME": str(folder / "home"),
                "TMPDIR": str(self.tmp),
            }
            (folder / "home").mkdir()
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            # where PostgreSQL's own user can reach it (pytest's folders are closed to other users)
            self.server = Path(tempfile.mkdtemp(prefix="psw-cluster-server-", dir="/tmp"))
        else:
            self.tmp, self.env, self.port, self.url, self.server = user.tmp, user.env, user.port, user.url, user.server
        self.caches = {"head": folder / "cache-head", "worker": folder / "cache-worker"}
        self.hf = {"head": folder / "hf-head", "worker": folder / "hf-worker"}  # each node's own Hugging Face cache
        self.hf_env: dict[str, dict[str, str]] = {}  # node kind -> its Hugging Face settings

    def script(self, *args: str, env=None, timeout: float = 300, session: bool = False):
        return run(["bash", *args], {**self.env, **(env or {})}, timeout, session)

    def start(self, *head_args: str, worker: bool = True) -> None:
        if self.user is None:
            srv = self.script(
                "scripts/mlflow_server.sh",
                "start",
                "--dir",
                str(self.server),
                "--port",
                str(self.port),
                "--pg-port",
                str(free_port()),
                "--workers",
                "2",
            )
            assert srv.returncode == 0, srv.stdout + srv.stderr
        self.creds = credentials(self.server)
        # the head runs the submitted jobs' drivers, with its environment: the server's credentials in it
        self.head = self.start_node("head", "--bench", *head_args, env=self.creds)
        if worker:
            self.start_node("worker", self.head["gcs_address"])

    def start_node(self, kind: str, *args: str, env=None) -> dict:
        """A node as a user starts it; its node.json, which the script wrote into its folder."""
        proc = subprocess.Popen(
            ["bash", "scripts/cluster.sh", kind, *args, "--cache", str(self.caches[kind]), "--num-cpus", "1"],
            env={**self.env, **self.hf_env.get(kind, {}), **(env or {})},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.sessions.append(proc.pid)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        name = out.split(" is up", 1)[0].split()[-1]
        info = json.loads((self.tmp / f"psw-ray-{os.getuid()}" / name / "node.json").read_text())
        self.nodes[name] = info
        return info

    def submit(self, *sweep_args: str, wait: bool = True):
        cmd = ["bash", "scripts/submit.sh", self.head["dashboard_url"], *sweep_args]
        if wait:
            return run(cmd, self.env, timeout=900)
        return subprocess.Popen(
            cmd, env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def runtime_env_logs(self, lines: int = 30) -> str:
        """The tails of the nodes' runtime_env logs (where a job's failed package download is told)."""
        folder = self.tmp / f"psw-ray-{os.getuid()}"
        tails = [
            f"== {f.relative_to(folder)}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
            for f in sorted(folder.glob("*/session_latest/logs/runtime_env*.log"))
        ]
        return "\n".join(tails)

    def alive(self) -> list[str]:
        """What of this cluster's processes is alive: its nodes' sessions, the scripts' own."""
        return [p for s in [n["sid"] for n in self.nodes.values()] + self.sessions for p in in_session(s)]

    def stop(self) -> list[str]:
        """Stop the nodes, each by its name, and the server (unless another's); what of them is still alive."""
        for name in [n for n in self.nodes if n not in self.stopped]:
            self.stopped.add(name)
            out = self.script("scripts/cluster.sh", "stop", name)
            assert out.returncode == 0 and f"stopped {name}" in out.stdout, out.stdout + out.stderr
        if self.user is None:
            self.script("scripts/mlflow_server.sh", "stop", "--dir", str(self.server))
        return self.alive()

    def api(self, path: str, body: dict | None = None):
        status, data = rest(
            self.url, path, self.creds["MLFLOW_TRACKING_USERNAME"], self.creds["MLFLOW_TRACKING_PASSWORD"], body
        )
        assert status == 200, (path, status, data)
        return data


def server_processes(folder: Path) -> list[str]:
    """The tracking server's processes (MLflow and PostgreSQL), by the folder they were given."""
    out = subprocess.run(["pgrep", "-af", str(folder)], capture_output=True, text=True).stdout.splitlines()
    return [ln for ln in out if "pgrep" not in ln]


@pytest.fixture(scope="module")
def submitted(tmp_path_factory):
    """The mission's command submitted to the loopback cluster: (cluster, job's output, REST
    view of its runs, what outlived the stop, server processes left)."""
    from huggingface_hub import snapshot_download

    folder = tmp_path_factory.mktemp("cluster")
    cluster = LoopbackCluster(folder)
    hub = tiny_llama_hub(folder / "hub-repo", HUB_ID)
    # the head reads its own cache alone (offline, filled beforehand); the worker's starts empty, the local Hub its only source
    snapshot_download(HUB_ID, cache_dir=cluster.hf["head"], endpoint=hub.endpoint)
    cluster.hf_env = {
        "head": {"HF_HUB_CACHE": str(cluster.hf["head"]), "HF_HUB_OFFLINE": "1"},
        "worker": {"HF_HUB_CACHE": str(cluster.hf["worker"]), "HF_ENDPOINT": hub.endpoint},
    }
    try:
        cluster.start("--port", str(free_port()), "--dashboard-port", str(free_port()))
        job = cluster.submit(*MISSION, *SUBMITTED_BENCH, "tracking=server", f"tracking.uri={cluster.url}")
        if job.returncode != 0:  # kept for the failure message: the nodes' folders go with the stop
            job.stderr += "\n" + cluster.runtime_env_logs()
        refused = cluster.submit("-m", "model=llama", "phase=decode", *FAST_OVERRIDES)  # no server: refused
        fetched = hub.downloads("model.safetensors")
        hub_job = cluster.submit(*HUB_SWEEP, *SUBMITTED_BENCH, "tracking=server", f"tracking.uri={cluster.url}")
        experiments = cluster.api("/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
        ids = [e["experiment_id"] for e in experiments if e["name"] != HUB_EXPERIMENT]
        hub_ids = [e["experiment_id"] for e in experiments if e["name"] == HUB_EXPERIMENT]
        hub_runs = cluster.api("/api/2.0/mlflow/runs/search", {"experiment_ids": hub_ids, "max_results": 100}).get("runs", []) if hub_ids else []
        cluster.hub_sweep = SimpleNamespace(job=hub_job, runs=hub_runs, hub=hub, fetched=hub.downloads("model.safetensors") - fetched)
        runs = cluster.api("/api/2.0/mlflow/runs/search", {"experiment_ids": ids, "max_results": 1000}).get("runs", [])
        listing = {}
        for r in runs:
            run_id = r["info"]["run_id"]
            for path in ("", "exports"):
                query = urllib.parse.urlencode({"run_id": run_id, "path": path})
                listing[(run_id, path)] = cluster.api(f"/api/2.0/mlflow/artifacts/list?{query}").get("files", [])
            for f in listing[(run_id, "exports")]:
                query = urllib.parse.urlencode({"run_id": run_id, "path": f["path"]})
                listing[(run_id, f["path"])] = cluster.api(f"/api/2.0/mlflow/artifacts/list?{query}").get("files", [])
    finally:
        left = cluster.stop()
        hub.shutdown()
    yield cluster, job, refused, runs, listing, left, server_processes(cluster.server)
    shutil.rmtree(cluster.server, ignore_errors=True)
    shutil.rmtree(cluster.tmp, ignore_errors=True)


def fields(run: dict, part: str) -> dict[str, str]:
    return {x["key"]: x["value"] for x in run["data"].get(part, [])}


@needs_postgres
def test_the_submitted_mission_records_every_variant_on_the_server(submitted):
    _, job, _, runs, listing, _, _ = submitted
    assert job.returncode == 0, job.stdout[-6000:] + job.stderr[-8000:]
    assert "succeeded" in job.stdout + job.stderr
    variants = {r["info"]["run_name"]: r for r in runs if fields(r, "tags").get("phasesweep.role") == "variant"}
    assert set(variants) == VARIANTS
    (parent,) = [r for r in runs if fields(r, "tags").get("phasesweep.role") == "sweep"]
    assert parent["info"]["status"] == "FINISHED" and fields(parent, "tags")["status"] == "ok"
    stored = {f["path"] for key, files in listing.items() if key[0] == parent["info"]["run_id"] for f in files}
    for name, r in variants.items():
        tags, metrics = fields(r, "tags"), {m["key"]: m["value"] for m in r["data"]["metrics"]}
        assert r["info"]["status"] == "FINISHED" and tags["status"] == "ok", (name, tags.get("error"))
        assert metrics["latency_ms_median"] > 0 and metrics["parity_max_abs_diff"] < 1e-4
        files = {f["path"] for f in listing[(r["info"]["run_id"], "")]}
        assert {"latency_samples.json", "parity.json", "config.yaml", "anatomy.json"} <= files, (name, files)
        model = tags["model_artifact"]  # stored once on the sweep's run, which this run points at
        assert model.split("/artifacts/", 1)[1] in stored, (model, stored)


def per_repeat(params: dict, key: str) -> list[str]:
    """A param's value for each of the variant's processes (listed where they differ)."""
    values = params[key].split(",")
    return values * REPEATS if len(values) == 1 else values


@needs_postgres
def test_benchmarks_ran_on_both_nodes_and_exports_crossed_between_them(submitted):
    cluster, _, _, runs, _, _, _ = submitted
    variants = [r for r in runs if fields(r, "tags").get("phasesweep.role") == "variant"]
    params = [fields(r, "params") for r in variants]
    ran_on = [per_repeat(p, "runtime.ray_node") for p in params]  # the node of each of its processes
    sources = [per_repeat(p, "runtime.export_source") for p in params]
    bench_nodes = {n for nodes in ran_on for n in nodes}
    assert len(bench_nodes) == 2, bench_nodes  # each node ran benchmarks
    # forked by a host actor's fork server: a Ray worker, at niceness 0 on a node of scripts/cluster.sh (Ray's default 15)
    assert {n for p in params for n in per_repeat(p, "runtime.niceness")} == {"0"}
    crossed: dict[
        tuple[int, str], list[str]
    ] = {}  # (variant, a node other than its export's) -> how its processes there got it
    for i, (p, nodes, srcs) in enumerate(zip(params, ran_on, sources, strict=True)):
        for node, src in zip(nodes, srcs, strict=True):
            if node != p["export.ray_node"]:
                crossed.setdefault((i, node), []).append(src)
    assert crossed, "no export was benchmarked on another node than the one that made it"
    # no shared folder: the first process there fetched it (a later one finds that copy local)
    assert all(srcs[0] == "fetched" and set(srcs) <= {"fetched", "local"} for srcs in crossed.values()), crossed
    assert all(p["runtime.process_start"] == "forked" for p in params)
    # each node kept what it made or fetched in its own cache, which no other node reads
    held = {
        kind: {e.name for e in folder.iterdir() if not e.name.startswith(".")}
        for kind, folder in cluster.caches.items()
    }
    assert held["head"] and held["worker"] and held["head"] != held["worker"], held


@needs_postgres
def test_a_hub_id_resolves_on_each_node_from_its_own_cache(submitted):
    """The same id and commit on both nodes, no shared folder: the head (offline) from its own
    cache, the worker by one download into its own, for all its tasks."""
    cluster = submitted[0]
    got = cluster.hub_sweep
    assert got.job.returncode == 0, got.job.stdout[-6000:] + got.job.stderr[-8000:]
    variants = {r["info"]["run_name"]: r for r in got.runs if fields(r, "tags").get("phasesweep.role") == "variant"}
    assert set(variants) == {f"Tiny-Llama_{p}_onnxruntime_cpu" for p in ("prefill", "decode")}, set(variants)
    params = [fields(r, "params") for r in variants.values()]
    assert all(fields(r, "tags")["status"] == "ok" for r in variants.values())
    assert all(p["model.checkpoint"] == HUB_ID and p["model.revision"] == got.hub.main for p in params), params
    nodes = {p["export.ray_node"] for p in params} | {n for p in params for n in per_repeat(p, "runtime.ray_node")}
    assert len(nodes) == 2, nodes  # each node resolved the id for a task of its own
    assert got.fetched == 1  # the worker's tasks: one download; the head's: none
    snapshot = Path("models--phasesweep-test--Tiny-Llama") / "snapshots" / got.hub.main / "model.safetensors"
    assert (cluster.hf["worker"] / snapshot).is_file() and (cluster.hf["head"] / snapshot).is_file()


@needs_postgres
def test_a_submitted_sweep_without_a_server_is_refused_before_any_work(submitted):
    _, _, refused, runs, _, _, _ = submitted
    assert refused.returncode != 0
    out = refused.stdout + refused.stderr
    assert "tracking.uri unset would keep this submitted sweep's runs in" in out, out[-3000:]
    assert "inside the Ray job's working directory, which Ray deletes after the job" in out
    assert len([r for r in runs if fields(r, "tags").get("phasesweep.role") == "sweep"]) == 1  # nothing more recorded


@needs_postgres
def test_nothing_the_cluster_test_started_is_left_running(submitted):
    cluster, *_, left, server = submitted
    assert left == [], f"Ray processes outlived the stop: {left}"
    assert server == [], f"tracking server processes outlived the stop: {server}"
    # every node's folder removed, the worker's included: no Ray folder in TMPDIR (where the nodes'
    # processes keep other things of their own, phasesweep's fork servers' included)
    assert not [p.name for p in cluster.tmp.iterdir() if p.name.startswith(("ray", "session_"))]
    assert list((cluster.tmp / f"psw-ray-{os.getuid()}").iterdir()) == []


# -- two clusters of one user on one machine ---------------------------------------------------

TWO = ["-m", "model=llama", "phase=prefill,decode", "backend=onnxruntime", "device=cpu", *FAST_OVERRIDES]
QUANT_B = "int4"  # the second cluster's sweep is quantised


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory):
    """Two one-node clusters started by scripts/cluster.sh on free ports, one sweep submitted to
    each at once, then the first stopped by name: (the clusters, the jobs' outputs, each
    experiment's runs, the second's `ray status` and live processes after the first's stop, what
    outlived both stops)."""
    folder = tmp_path_factory.mktemp("two")
    a = LoopbackCluster(folder / "a")
    b = LoopbackCluster(folder / "b", user=a)
    try:
        a.start(worker=False)
        b.start(worker=False)
        jobs = [  # b's quantised: an axis like any other on a cluster
            c.submit(*TWO, *extra, "tracking=server", f"tracking.uri={c.url}", f"tracking.experiment={n}", wait=False)
            for n, c, extra in (("a", a, []), ("b", b, [f"model.quant={QUANT_B}"]))
        ]
        outputs = [j.communicate(timeout=900)[0] for j in jobs]
        codes = [j.returncode for j in jobs]
        runs = {}
        for n in ("a", "b"):
            (exp,) = [
                e
                for e in a.api("/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
                if e["name"] == n
            ]
            runs[n] = a.api(
                "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 100}
            ).get("runs", [])
        a.stop()
        a_left = a.alive()
        b_alive = b.alive()
        env = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        ray = str(Path(sys.executable).parent / "ray")
        status = run([ray, "status", f"--address={b.head['gcs_address']}"], {**b.env, **env}, timeout=120)
    finally:
        b.stop()
        a.stop()  # where the test failed before
    yield SimpleNamespace(
        a=a,
        b=b,
        codes=codes,
        outputs=outputs,
        runs=runs,
        a_left=a_left,
        b_alive=b_alive,
        status=status,
        left=b.alive() + a.alive(),
    )
    shutil.rmtree(a.server, ignore_errors=True)
    shutil.rmtree(a.tmp, ignore_errors=True)


@needs_postgres
def test_two_clusters_each_run_only_their_own_jobs_tasks(two_clusters):
    t = two_clusters
    assert t.codes == [0, 0], [o[-4000:] for o in t.outputs]
    assert t.a.head["gcs_address"] != t.b.head["gcs_address"] and t.a.head["folder"] != t.b.head["folder"]
    for n, cluster in (("a", t.a), ("b", t.b)):
        own = {node["node_id"] for node in cluster.nodes.values()}
        variants = [r for r in t.runs[n] if fields(r, "tags").get("phasesweep.role") == "variant"]
        tail = f"_{QUANT_B}" if n == "b" else ""
        assert {r["info"]["run_name"] for r in variants} == {
            f"llama_prefill_onnxruntime_cpu{tail}",
            f"llama_decode_onnxruntime_cpu{tail}",
        }
        for r in variants:
            params = fields(r, "params")
            assert fields(r, "tags")["status"] == "ok", fields(r, "tags").get("error")
            assert params["model.quant"] == (QUANT_B if n == "b" else "none")
            assert {params["export.ray_node"], *params["runtime.ray_node"].split(",")} <= own, (n, params, own)


@needs_postgres
def test_stopping_one_cluster_by_name_leaves_the_other_running(two_clusters):
    t = two_clusters
    assert t.a_left == []  # every process of the first is gone
    assert t.b_alive, "the second cluster's processes were ended by the first one's stop"
    assert t.status.returncode == 0 and t.b.head["node_id"] in t.status.stdout, (
        t.status.stdout[-2000:] + t.status.stderr[-2000:]
    )
    assert t.left == []


def test_a_job_refuses_a_store_inside_its_working_directory(tmp_path, monkeypatch):
    """The check itself (orchestrator.record.tracking.check_outlives_job), each store it guards."""
    from orchestrator.plan.config import TrackingCfg
    from orchestrator.record.store import RAY_JOB_ENV, check_outlives_job
    from tasks.specs import ConfigError

    monkeypatch.chdir(tmp_path)
    check_outlives_job(TrackingCfg())  # not a Ray job: the local default is right
    monkeypatch.setenv(RAY_JOB_ENV, json.dumps({"runtime_env": {}}))
    with pytest.raises(ConfigError, match=r"tracking.uri unset would keep"):
        check_outlives_job(TrackingCfg())
    with pytest.raises(ConfigError, match=r"tracking.uri='sqlite:///runs.db' would keep"):
        check_outlives_job(TrackingCfg(uri="sqlite:///runs.db", artifact_root=str(tmp_path.parent / "a")))
    with pytest.raises(ConfigError, match=r"tracking.artifact_root='art' would keep"):
        check_outlives_job(TrackingCfg(uri=f"sqlite:///{tmp_path.parent / 'm.db'}", artifact_root="art"))
    check_outlives_job(
        TrackingCfg(uri=f"sqlite:///{tmp_path.parent / 'm.db'}", artifact_root=str(tmp_path.parent / "a"))
    )
    check_outlives_job(TrackingCfg(uri="http://127.0.0.1:5000"))
