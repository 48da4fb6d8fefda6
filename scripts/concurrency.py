"""N sweeps at once on one MLflow store and one export cache: is anything lost?

    python scripts/concurrency.py                 # 8 sweeps of 2 variants each, one sqlite store
    python scripts/concurrency.py --sweeps 4 --variants 3 --workdir /tmp/conc
    # 32 sweeps on a tracking server (scripts/mlflow_server.sh; MLFLOW_TRACKING_USERNAME and
    # MLFLOW_TRACKING_PASSWORD in the environment), all on one Ray started once:
    python scripts/concurrency.py --sweeps 32 --uri http://127.0.0.1:5000 --shared-ray

Each sweep is `python sweep.py -m` of the test-only `spin` backend (tests/spin_backend/),
`tracking.resume=false` so that every sweep measures every variant; all start together, each
in a folder and session of its own, with its own local Ray, all writing to
`<workdir>/mlflow.db` and sharing `<workdir>/export_cache` (new unless --workdir holds them).

--uri: the sweeps record to that tracking server, in an experiment of their own
(`concurrency-<time>`), and only that experiment is counted. --shared-ray: they join one Ray
head started for them (SharedRay) through `cluster.address=`, instead of a local Ray each.

Afterwards it counts what MLflow holds against what each sweep should have written: one
sweep run (FINISHED, with its summary.txt, summary.json, latency.png) and one variant run per
variant (FINISHED, status ok, the same metric keys as every other, config.yaml, parity.json,
latency_samples.json), and no run left RUNNING. It prints the figures and exits 1 on any loss.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.common.ray_env import LOCAL_ENV, ensure_auth_token  # noqa: E402
from orchestrator.run.ray_session import LOCAL_START_ATTEMPTS  # noqa: E402

SPIN = ROOT / "tests" / "spin_backend"
# a few calls per variant: what is under test is the recording, not the measurement
FAST = [
    "bench.warmup_iters=2",
    "bench.warmup_max_seconds=1",
    "bench.min_iters=5",
    "bench.min_seconds=0.05",
    "bench.max_seconds=1",
    "bench.target_ci=10",
    "bench.threads=1",
    "phase.batch=2",
    "phase.context_len=24",
]
SWEEP_ARTIFACTS = {"summary.txt", "summary.json", "latency.png"}
VARIANT_ARTIFACTS = {"config.yaml", "parity.json", "latency_samples.json"}


def sweep_args(
    workdir: Path,
    variants: int,
    extra: list[str],
    export_cache: Path | None = None,
    uri: str | None = None,
    experiment: str | None = None,
) -> list[str]:
    spins = ",".join(str(i) for i in range(variants))
    store = [f"tracking.uri={uri}"] if uri else [f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}"]
    if not uri:
        store.append(f"tracking.artifact_root={workdir / 'mlartifacts'}")
    if experiment:
        store.append(f"tracking.experiment={experiment}")
    return [
        "-m",
        "model=llama",
        "phase=decode",
        "backend=spin",
        f"hydra.searchpath=[file://{SPIN / 'conf'}]",
        *FAST,
        f"backend.options.spin_us={spins}",
        f"cluster.export_cache={export_cache or workdir / 'export_cache'}",
        *store,
        "tracking.resume=false",
        *extra,
    ]


def _env(cwd: Path | None = None) -> dict[str, str]:
    """The sweeps' (and the shared Ray's) environment: the spin backend importable everywhere."""
    path = [str(SPIN), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return {**env, "PWD": str(cwd)} if cwd else env


def start(cwd: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    with open(cwd / "output.txt", "w") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "sweep.py"), *args],
            cwd=cwd,
            env={**_env(cwd), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# -- one Ray for all the sweeps ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_session(sid: int) -> list[int]:
    """Live processes of session `sid`, from /proc/<pid>/stat (field 6)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        if int(rest[3]) == sid and rest[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


class SharedRay:
    """A Ray head on 127.0.0.1 for the sweeps to join (`address`): `ray start --head --block` in
    a session, temp folder and ports of its own, so no other Ray on the machine is touched;
    started again, clean, when a start fails (as the driver's local Ray is); `close()` ends
    that session (never `ray stop`, which ends every Ray of the user)."""

    ray = Path(sys.executable).with_name("ray")

    def __init__(self, workdir: Path, timeout_s: float = 120, attempts: int = LOCAL_START_ATTEMPTS):
        self.log = workdir / "ray_head.txt"
        self.log.write_text("")
        ensure_auth_token()  # `ray start --head` refuses to start without one
        for attempt in range(1, attempts + 1):
            if self._start(timeout_s):
                return
            self.close()
            if attempt == attempts:
                raise RuntimeError(f"the shared Ray head did not start in {attempts} attempts (see {self.log})")
            print(f"the shared Ray head did not start; starting it again ({attempt + 1} of {attempts})", file=sys.stderr)

    def _start(self, timeout_s: float) -> bool:
        """One start; whether the head said it is up within `timeout_s`."""
        port = _free_port()
        self.temp = Path(tempfile.mkdtemp(prefix="psw-ray-", dir="/tmp"))  # short: Ray's socket paths
        self.address = f"127.0.0.1:{port}"
        args = ["--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={self.temp}"]
        args += [f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}"]
        args += ["--include-dashboard=false", f"--num-cpus={os.cpu_count()}", '--resources={"phasesweep_bench": 1}']
        args.append("--disable-usage-stats")
        offset = self.log.stat().st_size
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                [str(self.ray), "start", *args],
                env={**_env(), **LOCAL_ENV},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in self.log.read_text()[offset:]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def close(self, grace_s: float = 30) -> list[int]:
        """End the head's session; the pids still there after `grace_s` (then killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (left := _in_session(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.temp, ignore_errors=True)
        return left


def count(uri: str, sweeps: int, variants: int, experiment: str | None = None) -> dict:
    """What the store holds against what `sweeps` sweeps of `variants` variants should have
    written: the whole store, or the one experiment named."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        ids = [exp.experiment_id] if exp else []
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, max_results=50000) if ids else []
    parents = [r for r in runs if r.data.tags.get("phasesweep.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("phasesweep.role") == "variant"]
    metric_keys = set().union(*(r.data.metrics for r in children)) if children else set()
    lost: list[str] = []
    found = {"runs": 0, "metrics": 0, "artifacts": 0}
    for p in parents:
        found["runs"] += 1
        names = {a.path for a in client.list_artifacts(p.info.run_id)}
        found["artifacts"] += len(names & SWEEP_ARTIFACTS)
        lost += [f"{p.info.run_name}: {a}" for a in sorted(SWEEP_ARTIFACTS - names)]
        if p.info.status != "FINISHED":
            lost.append(f"{p.info.run_name}: status {p.info.status}")
        kids = [r for r in children if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
        if len(kids) != variants:
            lost.append(f"{p.info.run_name}: {len(kids)} variant run(s), not {variants}")
    for r in children:
        found["runs"] += 1
        found["metrics"] += len(r.data.metrics)
        lost += [
            f"{r.info.run_name} ({r.info.run_id[:8]}): metric {m}" for m in sorted(metric_keys - set(r.data.metrics))
        ]
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        found["artifacts"] += len(names & VARIANT_ARTIFACTS)
        lost += [f"{r.info.run_name} ({r.info.run_id[:8]}): {a}" for a in sorted(VARIANT_ARTIFACTS - names)]
        if r.info.status != "FINISHED" or r.data.tags.get("status") != "ok":
            lost.append(f"{r.info.run_name} ({r.info.run_id[:8]}): {r.info.status} {r.data.tags.get('error', '')}")
    expected = {
        "runs": sweeps * (1 + variants),
        "metrics": sweeps * variants * len(metric_keys),
        "artifacts": sweeps * (len(SWEEP_ARTIFACTS) + variants * len(VARIANT_ARTIFACTS)),
    }
    if len(parents) != sweeps:
        lost.append(f"{len(parents)} sweep run(s), not {sweeps}")
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    return {"expected": expected, "found": found, "lost": lost, "running": running}


def why(output: Path) -> list[str]:
    """The line of a failed sweep's output that says why: the last 'phasesweep: ...' line or
    exception ('SomeError: ...', a traceback's last line), else its last line."""
    lines = output.read_text(errors="replace").strip().splitlines()
    telling = [ln for ln in lines if re.match(r"phasesweep: |[A-Za-z_][\w.]*(Error|Exception)\b.*: ", ln)]
    return (telling or lines)[-1:]


def run(
    sweeps: int,
    variants: int,
    workdir: Path,
    extra: list[str] | None = None,
    export_cache: Path | None = None,
    timeout_s: float = 1800,
    uri: str | None = None,
    shared_ray: bool = False,
) -> dict:
    """Start `sweeps` sweeps at once, wait for them all, count what MLflow holds. `uri`: a
    tracking server (credentials from the environment), else `<workdir>/mlflow.db`;
    `shared_ray`: the sweeps join one Ray head started here, else each starts its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    experiment = f"concurrency-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}" if uri else None
    extra = list(extra or [])
    ray = SharedRay(workdir) if shared_ray else None
    env = LOCAL_ENV if ray else None
    try:
        if ray:
            extra.append(f"cluster.address={ray.address}")
        args = sweep_args(workdir, variants, extra, export_cache, uri, experiment)
        t0 = time.monotonic()
        procs = [start(workdir / f"sweep{i}", args, env) for i in range(sweeps)]
        ends = []
        for p in procs:
            try:
                p.wait(max(1.0, timeout_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            ends.append(time.monotonic() - t0)
    finally:
        ray_left = ray.close() if ray else []
    report = count(uri or f"sqlite:///{workdir / 'mlflow.db'}", sweeps, variants, experiment)
    report.update(
        sweeps=sweeps,
        variants=variants,
        exit_codes=[p.returncode for p in procs],
        seconds=round(max(ends), 1),
        workdir=str(workdir),
        store=uri or "sqlite",
        experiment=experiment,
        ray="shared" if ray else "one per sweep",
        ray_left=ray_left,
    )
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    report["failed_sweeps"] = {i: why(workdir / f"sweep{i}" / "output.txt") for i in failed}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=8, help="sweeps started at once (default 8)")
    ap.add_argument("--variants", type=int, default=2, help="variants per sweep (default 2)")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="store, cache and the sweeps' folders (default: a new temp dir)"
    )
    ap.add_argument("--export-cache", type=Path, default=None, help="default: <workdir>/export_cache")
    ap.add_argument(
        "--uri",
        default=None,
        help="a tracking server, http://HOST:PORT (credentials: MLFLOW_TRACKING_USERNAME/PASSWORD); "
        "default: <workdir>/mlflow.db",
    )
    ap.add_argument(
        "--shared-ray", action="store_true", help="the sweeps join one Ray head started once, not one Ray each"
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds the sweeps get, all together")
    ap.add_argument("extra", nargs="*", help="more overrides for every sweep")
    a = ap.parse_args(argv)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="phasesweep-concurrency-"))
    report = run(a.sweeps, a.variants, workdir, a.extra, a.export_cache, a.timeout, a.uri, a.shared_ray)
    e, f = report["expected"], report["found"]
    print(f"{report['sweeps']} sweeps x {report['variants']} variants at once, {report['seconds']}s, in {workdir}")
    where = f"{report['store']}" + (f", experiment {report['experiment']}" if report["experiment"] else "")
    print(f"  store        {where}; Ray: {report['ray']}")
    print(f"  exit codes   {report['exit_codes']}")
    for k in ("runs", "metrics", "artifacts"):
        print(f"  {k:<12} {f[k]} of {e[k]}")
    print(f"  RUNNING      {len(report['running'])}")
    for i, last in report["failed_sweeps"].items():
        print(f"  sweep{i} failed: {' '.join(last)}")
    for line in report["lost"]:
        print(f"  lost: {line}")
    if report["ray_left"]:
        print(f"  shared Ray: {len(report['ray_left'])} process(es) outlived it (killed)")
    (workdir / "report.json").write_text(json.dumps(report, indent=1))
    return 1 if report["lost"] or report["running"] or report["failed_sweeps"] else 0


if __name__ == "__main__":
    sys.exit(main())
