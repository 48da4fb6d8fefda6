"""How much time does the orchestration cost, and what does phasesweep's launcher save? A
benchmark, not a test: each step runs `python sweep.py` as a user would, in a fresh folder
of its own (its own MLflow store), and is timed from outside, wall clock.

  1. basic cold    a 16-variant tiny grid through Hydra's basic launcher
                   (`hydra/launcher=basic`): one job at a time, each starting its own Ray,
                   exporting into an empty export cache
  2. ours cold     the same grid through phasesweep's launcher: planned at once, one Ray,
                   exports deduplicated and run beside benchmarks, an empty export cache
  3. ours warm     step 2 again in a new folder with step 2's export cache
                   (`tracking.resume=false` is implied by the new store: everything is measured)
  4. planning      the dry run of a 10,080-variant grid (tests/test_planning_scale.py's)
  5. mission cold  `python sweep.py -m model=llama,phi3 phase=prefill,decode`, an empty
                   cache; with the time to its first line (Ray up, the grid planned)

Every grid uses the same short measurement (`bench.min_seconds=0.2`, ...), so the steps
differ in orchestration, not in how long each benchmark runs. Targets from issue #10, on
2 cores: ours >= 1.7x faster than basic cold, warm >= 2x faster than cold, planning <= 10 s,
the mission cold <= 15 s. The figures are printed as a table (and --json writes them).

`--against CMD` times the mission command (as users run it: default measurement, an empty
cache, a new folder) and another tool's command for the same grid alternately, `--rounds`
times each, and prints their ratio round by round: a ratio taken in one sitting holds when
the machine's speed drifts. Nothing else runs then.

    python scripts/bench_orchestration.py
    python scripts/bench_orchestration.py --json figures.json --keep /tmp/bo
    python scripts/bench_orchestration.py --against "/path/to/run_anchor.sh grid" --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# 2 models x 2 phases x 2 backends x 2 batches = 16 variants, 8 exports (a batch is a shape)
GRID_16 = ["model=llama,phi3", "phase=prefill,decode", "backend=onnxruntime,eager", "phase.batch=1,2"]
MISSION = ["model=llama,phi3", "phase=prefill,decode"]
SHORT_BENCH = ["bench.min_seconds=0.2", "bench.max_seconds=1", "bench.warmup_max_seconds=0.5"]
TARGETS = {"speedup_vs_basic": 1.7, "warm_speedup": 2.0, "planning_s": 10.0, "mission_cold_s": 15.0}


def sweep(folder: Path, *args: str) -> tuple[float, float | None, str]:
    """`python sweep.py -m *args` in `folder`: (wall seconds, seconds to its first line, output)."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "sweep.py"), "-m", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first, lines = None, []
    for line in proc.stdout:
        if first is None and line.startswith("phasesweep: "):
            first = time.perf_counter() - t0
        lines.append(line)
    proc.wait()
    wall = time.perf_counter() - t0
    out = "".join(lines)
    if proc.returncode != 0:
        sys.exit(f"bench_orchestration: `{' '.join(cmd)}` in {folder} exited {proc.returncode}:\n{out[-3000:]}")
    return wall, first, out


def against(other: str, rounds: int, work: Path) -> int:
    """The mission command and `other`, alternately, `rounds` times: each wall time and their ratio."""
    ratios = []
    for r in range(rounds):
        t0 = time.perf_counter()
        done = subprocess.run(shlex.split(other), cwd=work, capture_output=True, text=True)
        theirs = time.perf_counter() - t0
        if done.returncode != 0:
            print(f"  (`{other}` exited {done.returncode}; its time still counts: {done.stdout[-300:]})", flush=True)
        ours, _, _ = sweep(work / f"mission_{r}", *MISSION, f"cluster.export_cache={work / f'cache_{r}'}")
        ratios.append(ours / theirs)
        print(f"round {r + 1}: theirs {theirs:.1f} s, ours {ours:.1f} s, ours/theirs {ratios[-1]:.3f}", flush=True)
    print(f"ours/theirs, median of {rounds}: {statistics.median(ratios):.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    p.add_argument("--against", help="another tool's command for the default grid, timed alternately with the mission command")
    p.add_argument("--rounds", type=int, default=2, help="--against: rounds of each (default 2)")
    args = p.parse_args(argv)
    if args.against:
        work = args.keep or Path(tempfile.mkdtemp(prefix="phasesweep-bench-orch-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            return against(args.against, args.rounds, work)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    from tests.test_planning_scale import GRID_10K

    work = args.keep or Path(tempfile.mkdtemp(prefix="phasesweep-bench-orch-"))
    work.mkdir(parents=True, exist_ok=True)
    fig: dict[str, float] = {}
    try:
        cache = f"cluster.export_cache={work / 'cache_basic'}"
        fig["basic_cold_s"], _, _ = sweep(work / "basic", *GRID_16, *SHORT_BENCH, cache, "hydra/launcher=basic")
        print(f"basic cold: {fig['basic_cold_s']:.1f} s", flush=True)
        cache = f"cluster.export_cache={work / 'cache_ours'}"
        fig["ours_cold_s"], _, _ = sweep(work / "ours_cold", *GRID_16, *SHORT_BENCH, cache)
        print(f"ours cold: {fig['ours_cold_s']:.1f} s", flush=True)
        fig["ours_warm_s"], _, _ = sweep(work / "ours_warm", *GRID_16, *SHORT_BENCH, cache)
        print(f"ours warm: {fig['ours_warm_s']:.1f} s", flush=True)
        fig["planning_s"], _, out = sweep(work / "plan", *GRID_10K, "hydra.launcher.dry_run=true")
        assert out.startswith("phasesweep: 10080 variant(s)"), out[:300]
        print(f"10,080-variant dry run: {fig['planning_s']:.1f} s", flush=True)
        cache = f"cluster.export_cache={work / 'cache_mission'}"
        fig["mission_cold_s"], fig["mission_first_line_s"], _ = sweep(work / "mission", *MISSION, cache)
        print(f"mission cold: {fig['mission_cold_s']:.1f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    fig["speedup_vs_basic"] = fig["basic_cold_s"] / fig["ours_cold_s"]
    fig["warm_speedup"] = fig["ours_cold_s"] / fig["ours_warm_s"]
    rows = [
        ("16 variants, Hydra's basic launcher, cold", f"{fig['basic_cold_s']:.1f} s", ""),
        ("16 variants, phasesweep's launcher, cold", f"{fig['ours_cold_s']:.1f} s", ""),
        ("16 variants, phasesweep's launcher, export cache warm", f"{fig['ours_warm_s']:.1f} s", ""),
        ("ours vs basic, cold", f"{fig['speedup_vs_basic']:.2f}x", ">= 1.7x"),
        ("warm vs cold", f"{fig['warm_speedup']:.2f}x", ">= 2x"),
        ("10,080-variant dry run (process wall)", f"{fig['planning_s']:.1f} s", "<= 10 s"),
        ("mission command, cold", f"{fig['mission_cold_s']:.1f} s", "<= 15 s"),
        ("  of which before its first line (Ray up, planned)", f"{fig['mission_first_line_s']:.1f} s", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'step':<{width}}  {'figure':>8}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>8}  {target}")
    if args.json:
        args.json.write_text(json.dumps({**fig, "targets": TARGETS}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
