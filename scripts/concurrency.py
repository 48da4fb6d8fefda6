"""N sweeps at once on one MLflow sqlite store and one export cache: is anything lost?

    python scripts/concurrency.py                 # 8 sweeps of 2 variants each
    python scripts/concurrency.py --sweeps 4 --variants 3 --workdir /tmp/conc

Each sweep is `python sweep.py -m` of the test-only `spin` backend (tests/spin_backend/:
eager plus a busy-wait of `spin_us`), `tracking.resume=false` so that every sweep measures
every variant; all start together, each in a folder and session of its own, each with its
own local Ray, all writing to `<workdir>/mlflow.db` and sharing `<workdir>/export_cache`
(the store and the cache are new unless --workdir holds them: the sweeps create them, the
experiment included, at the same time).

Afterwards it counts what MLflow holds against what each sweep should have written: one
sweep run (FINISHED, with its summary.txt, summary.json, latency.png) and one variant run per
variant (FINISHED, status ok, the same metric keys as every other, config.yaml, parity.json,
latency_samples.json), and no run left RUNNING. It prints the figures and exits 1 on any loss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def sweep_args(workdir: Path, variants: int, extra: list[str], export_cache: Path | None = None) -> list[str]:
    spins = ",".join(str(i) for i in range(variants))
    return [
        "-m",
        "model=llama",
        "phase=decode",
        "backend=spin",
        f"hydra.searchpath=[file://{SPIN / 'conf'}]",
        *FAST,
        f"backend.options.spin_us={spins}",
        f"cluster.export_cache={export_cache or workdir / 'export_cache'}",
        f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}",
        f"tracking.artifact_root={workdir / 'mlartifacts'}",
        "tracking.resume=false",
        *extra,
    ]


def start(cwd: Path, args: list[str]) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    path = [str(SPIN), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    with open(cwd / "output.txt", "w") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "sweep.py"), *args],
            cwd=cwd,
            env={**os.environ, "PWD": str(cwd), "PYTHONPATH": os.pathsep.join(path)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def count(uri: str, sweeps: int, variants: int) -> dict:
    """What the store holds against what `sweeps` sweeps of `variants` variants should have written."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
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


def run(
    sweeps: int,
    variants: int,
    workdir: Path,
    extra: list[str] | None = None,
    export_cache: Path | None = None,
    timeout_s: float = 1800,
) -> dict:
    """Start `sweeps` sweeps at once, wait for them all, count what MLflow holds."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = sweep_args(workdir, variants, list(extra or []), export_cache)
    t0 = time.monotonic()
    procs = [start(workdir / f"sweep{i}", args) for i in range(sweeps)]
    ends = []
    for p in procs:
        try:
            p.wait(max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        ends.append(time.monotonic() - t0)
    report = count(f"sqlite:///{workdir / 'mlflow.db'}", sweeps, variants)
    report.update(
        sweeps=sweeps,
        variants=variants,
        exit_codes=[p.returncode for p in procs],
        seconds=round(max(ends), 1),
        workdir=str(workdir),
    )
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    report["failed_sweeps"] = {
        i: (workdir / f"sweep{i}" / "output.txt").read_text().strip().splitlines()[-1:] for i in failed
    }
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=8, help="sweeps started at once (default 8)")
    ap.add_argument("--variants", type=int, default=2, help="variants per sweep (default 2)")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="store, cache and the sweeps' folders (default: a new temp dir)"
    )
    ap.add_argument("--export-cache", type=Path, default=None, help="default: <workdir>/export_cache")
    ap.add_argument("extra", nargs="*", help="more overrides for every sweep")
    a = ap.parse_args(argv)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="phasesweep-concurrency-"))
    report = run(a.sweeps, a.variants, workdir, a.extra, a.export_cache)
    e, f = report["expected"], report["found"]
    print(f"{report['sweeps']} sweeps x {report['variants']} variants at once, {report['seconds']}s, in {workdir}")
    print(f"  exit codes   {report['exit_codes']}")
    for k in ("runs", "metrics", "artifacts"):
        print(f"  {k:<12} {f[k]} of {e[k]}")
    print(f"  RUNNING      {len(report['running'])}")
    for i, last in report["failed_sweeps"].items():
        print(f"  sweep{i} failed: {' '.join(last)}")
    for line in report["lost"]:
        print(f"  lost: {line}")
    (workdir / "report.json").write_text(json.dumps(report, indent=1))
    return 1 if report["lost"] or report["running"] or report["failed_sweeps"] else 0


if __name__ == "__main__":
    sys.exit(main())
