"""Planning at scale, without Ray or exports: a 10,000-variant grid's dry run, and plan
building that stays linear in the grid. The checks are structural (configs composed, group
contents converted, lines of our code run), plus one bound on this process's CPU time."""

from __future__ import annotations

import itertools
import sys
import time

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl

import orchestrator.plan.config
from orchestrator.plan.compose import JobConfigs
from orchestrator.plan.config import validate_all
from orchestrator.plan.planner import make_plan
from orchestrator.read.summary import plan_text
from tests.conftest import ROOT, capacity

pytestmark = pytest.mark.slow  # 10k-variant plans: a scale guard, not the quick loop

# 2 x 2 x 4 x 2 = 32 combinations of group choices x 360 value overrides = 11,520 jobs:
# 10,080 variants, 1,440 skipped (executorch has no cuda)
GRID_10K = [
    "model=llama,phi3",
    "phase=prefill,decode",
    "backend=eager,compile,onnxruntime,executorch",
    "device=cpu,cuda",
    "phase.batch=1,2,3,4,5,6,7,8",
    "model.seed=0,1,2,3,4,5,6,7,8",
    "bench.repeats=1,2,3,4,5",
]
BATCH_SUFFIXES = tuple(f"_b{b}" for b in range(1, 9))
CPU_BOUND_S = 20.0  # twice the 10 s target: catches a compose per job or quadratic work, not jitter


def test_a_10k_variant_grid_dry_run_plans_in_seconds(sweep_in_tmp, tmp_path, capsys, monkeypatch):
    composed, converted = [], []
    compose, section = ConfigLoaderImpl.load_sweep_config, orchestrator.plan.config._section
    monkeypatch.setattr(
        ConfigLoaderImpl, "load_sweep_config", lambda self, *a, **k: composed.append(a[1]) or compose(self, *a, **k)
    )
    monkeypatch.setattr(
        orchestrator.plan.config, "_section", lambda sections, i, key: converted.append(key) or section(sections, i, key)
    )
    wall, cpu = time.perf_counter(), time.process_time()
    sweep_in_tmp("-m", *GRID_10K, "hydra.launcher.dry_run=true")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out = capsys.readouterr().out
    assert out.startswith("phasesweep: 10080 variant(s), 864 export(s), 1440 skipped\n")
    rows = [line.split() for line in out.splitlines() if line.startswith(("llama_", "phi3_"))]
    skipped = [row[0] for row in rows if row[1].startswith("(job")]  # the skipped table: name (job #N) reason
    named = [row[0] for row in rows if not row[1].startswith("(job") and row[0].endswith(BATCH_SUFFIXES)]
    assert len(named) == len(set(named)) == 10080  # every variant listed, named by what varies
    assert len(skipped) == len(set(skipped)) == 1440 and not set(skipped) & set(named)  # skipped ones too
    # Hydra composed the reference and one star per other group option (phi3, decode,
    # compile, onnxruntime, executorch, cuda): the other 25 combinations were swapped together
    assert len(composed) == 7, composed
    # each distinct group content converted once: 2 models x 9 seeds, 2 phases x 8 batches,
    # 4 backends, 2 devices, 5 bench settings, 1 tracking, 1 cluster, 1 env
    assert len(converted) == 18 + 16 + 4 + 2 + 5 + 1 + 1 + 1
    assert not (tmp_path / "mlflow.db").exists()  # a dry run creates no store
    print(f"10k dry run: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr)
    assert cpu < CPU_BOUND_S, f"planning took {cpu:.1f} s of CPU ({wall:.1f} s wall)"


def _lines_run_in_orchestrator(fn) -> int:
    """How many lines of orchestrator/ code `fn()` executes (each loop iteration counts):
    a count of work that does not depend on the machine's load."""
    prefix, count = str(ROOT / "orchestrator"), 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(prefix) else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def test_planning_is_linear_in_the_grid(hydra_loader):
    """Composing, validating, planning and printing a grid twice the size runs about twice
    the lines of our code (quadratic work would run about 4 times as many)."""
    loader, master = hydra_loader

    def plan(seeds: int):
        axes = [["model=llama", "model=phi3"], ["phase=prefill", "phase=decode"]]
        axes += [[f"phase.batch={b}" for b in range(1, 6)], [f"model.seed={s}" for s in range(seeds)]]
        axes += [["bench.repeats=1", "bench.repeats=2"], ["backend.devices=[cpu]", "backend.devices=[cpu,cuda]"]]
        jobs = [list(j) for j in itertools.product(*axes)]

        def run():
            configs = JobConfigs(loader, master, jobs)
            p = make_plan(validate_all(configs, jobs), configs, jobs, capacity())
            assert len(p.variants) == len(jobs)
            plan_text(p)

        return len(jobs), _lines_run_in_orchestrator(run)

    (n, small), (n2, large) = plan(3), plan(6)
    assert n2 == 2 * n == 480
    print(f"{n} jobs: {small} lines, {n2} jobs: {large} lines ({large / small:.2f}x)", file=sys.stderr)
    assert large / small < 2.3, f"{n} jobs: {small} lines, {n2} jobs: {large} lines"
