"""The regression verdict end to end, on a slowdown of known size: three real sweeps of the
test-only `spin` backend (tests/spin_backend/: eager plus a busy-wait of spin_us in every
timed call) into one MLflow store, compared by `orchestrator.compare.main`.

    baseline   spin_us=40000   \
    rerun      spin_us=40000    > the same variant name, llama_decode_spin_cpu
    candidate  spin_us=160000  /

- baseline vs rerun: nothing changed, so never `slower` (exit 0);
- baseline vs candidate: `slower` (exit 1), the ratio of medians what 120 ms on top of the
  baseline's own median predicts, its interval wholly above 1 + min_effect.

The spin is wall-clock time, so it takes the same 40 or 160 ms whatever the machine's speed,
and dwarfs the tiny model's own call (2-3 ms here on a quiet machine; other work on the
same 2 cores has stretched it to ~14 ms): the ratio's size holds within a few percent
however the machine's speed moves between the sweeps (a 5 ms spin, tried first, left the
model a third of the baseline's call: a CI run beside other work measured the candidate's
calls at 34 ms instead of 23). Where the machine's speed did change between two sweeps,
compare says so (its speed probe) and asks a 50% effect before calling one: the 4x slowdown
is called anyway, the rerun never is.

The sweeps run in this process (configs composed with Hydra's compose API, run_sweep called
directly, on one local Ray started for the three) and share the session's export cache, so
the decode export (format `none`, the same entry eager uses) is made at most once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import CONF, SHAPE_OVERRIDES

pytestmark = pytest.mark.slow
SPIN = Path(__file__).resolve().parent / "spin_backend"
VARIANT = "llama_decode_spin_cpu"
SPIN_US = 40_000
MIN_EFFECT = 0.05  # compare's default, passed explicitly so the assertions below say what they rely on
MIN_ITERS = 30
# Enough samples for a tight interval: MIN_ITERS calls, which end the window once the
# interval is within target_ci (a spin-dominated call's spread is small: ~1.3 s of timing
# for the baseline, ~5 s for the candidate). max_seconds only bounds a window that never
# gets there, far above MIN_ITERS calls even with the model stretched 5x.
BENCH = [
    "bench.threads=1",
    "bench.warmup_iters=5",
    "bench.warmup_max_seconds=0.5",
    f"bench.min_iters={MIN_ITERS}",
    "bench.min_seconds=0.5",
    "bench.max_seconds=12",
    "bench.target_ci=0.02",
    "bench.repeats=1",
]
# the candidate's 120 ms more is far beyond the 50% a verdict needs when the machine's
# speed changed between the sweeps
SPINS = {"baseline": SPIN_US, "rerun": SPIN_US, "candidate": 4 * SPIN_US}


def compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("sweep", overrides=overrides)


def sweep(name: str, spin_us: int, common: list[str], out: Path) -> str:
    """One sweep of the spin variant; returns its sweep (parent) run id."""
    from mlflow.tracking import MlflowClient

    from orchestrator.run.sweep import run_sweep

    overrides = [*common, f"backend.options.spin_us={spin_us}"]
    outcomes = run_sweep([compose(overrides)], [overrides], out / name, f"pytest test_verdict: {name}")
    (outcome,) = outcomes.values()
    assert outcome.name == VARIANT and outcome.status == "ok", (outcome.stage, outcome.error)
    uri = next(o for o in common if o.startswith("tracking.uri=")).removeprefix("tracking.uri=")
    return MlflowClient(tracking_uri=uri).get_run(outcome.run_id).data.tags["mlflow.parentRunId"]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, mlflow_db, cache_override):
    """The three sweeps, once: {"uri", "client", "baseline", "rerun", "candidate"} (parent run
    ids) and "runs": each sweep's variant run."""
    from mlflow.tracking import MlflowClient

    from orchestrator.plan.config import validate_all
    from orchestrator.run.scheduler import Scheduler

    folder = tmp_path_factory.mktemp("verdict")
    uri = mlflow_db(folder)
    common = [
        "model=llama",
        "phase=decode",
        "backend=spin",
        f"hydra.searchpath=[file://{SPIN / 'conf'}]",
        *SHAPE_OVERRIDES,
        *BENCH,
        cache_override,
        f"tracking.uri={uri}",
        f"tracking.artifact_root={folder / 'mlartifacts'}",
        "tracking.resume=false",  # the rerun is measured again, not linked to the baseline's run
    ]
    with pytest.MonkeyPatch.context() as mp:
        # spin_runtime is imported by name here (planning), on Ray's workers and in the
        # benchmark processes they spawn: on sys.path and PYTHONPATH before Ray starts
        mp.syspath_prepend(str(SPIN))
        path = [str(SPIN), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), str(CONF.parent)]
        mp.setenv("PYTHONPATH", os.pathsep.join(path))
        # one local Ray for the three sweeps, started as run_sweep starts it: each run_sweep
        # finds it running and leaves it so (a Ray start costs seconds; it is not under test here)
        (point,) = validate_all([compose(common)], [common])
        with Scheduler(point.cluster):
            ids = {name: sweep(name, us, common, folder) for name, us in SPINS.items()}
    sys.modules.pop("spin_runtime", None)
    client = MlflowClient(tracking_uri=uri)
    runs = {}
    for name, parent_id in ids.items():
        exp = client.get_run(parent_id).info.experiment_id
        (runs[name],) = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    return {"uri": uri, "client": client, "runs": runs, **ids}


def machine(sweeps, name: str) -> str:
    """How the sweep's timed window went: its median, its fastest call, the machine-speed
    probe and what else ran on the bench core (printed beside each verdict)."""
    m = sweeps["runs"][name].data.metrics
    return (
        f"{name}: median {m['latency_ms_median']:.3f} ms, min {m['latency_ms_min']:.3f} ms, speed probe "
        f"{m['machine_probe_us']:.0f} us (iqr {m['machine_probe_iqr_rel']:.0%}), other processes took "
        f"{m.get('other_cpu_fraction', 0):.0%} of the bench core"
    )


def compare(sweeps, baseline: str, candidate: str, capsys, *extra: str) -> tuple[int, dict, str]:
    """compare.main on two of the sweeps: (exit status, the spin variant's row of the
    compare.json logged on the candidate's sweep run, the printed table)."""
    from orchestrator.compare import main

    code = main([sweeps[baseline], sweeps[candidate], "--uri", sweeps["uri"], "--min-effect", str(MIN_EFFECT), *extra])
    printed = capsys.readouterr().out
    client = sweeps["client"]
    report = json.loads(Path(client.download_artifacts(sweeps[candidate], "compare.json")).read_text())
    assert report["baseline"] == sweeps[baseline] and report["candidate"] == sweeps[candidate]
    assert client.get_run(sweeps[candidate]).data.tags["compare.baseline"] == sweeps[baseline]
    (row,) = report["variants"]
    assert row["variant"] == VARIANT and row["variant"] in printed
    assert not report["only_in_baseline"] and not report["only_in_candidate"]
    assert code == (1 if row["verdict"] == "slower" else 0), printed  # the exit status is the verdict's
    with capsys.disabled():
        print(
            f"\n{baseline} -> {candidate}: {row['median_baseline_ms']:.4f} -> {row['median_candidate_ms']:.4f} ms, "
            f"ratio {row['ratio']:.3f} [{row['ratio_ci_low']:.3f}, {row['ratio_ci_high']:.3f}], "
            f"p_holm {row['p_holm']:.2g}: {row['verdict']}  ("
            + "; ".join(machine(sweeps, n) for n in (baseline, candidate))
            + ")"
        )
    return code, row, printed


def drifted(row) -> bool:
    """Two sweeps timed while the machine's own speed differed: the unpaired verdict says so, and
    only the re-measured one (below) is held to the answer."""
    return "shared cores" in row["verdict"]


def test_an_identical_rerun_is_never_slower(sweeps, capsys):
    code, row, printed = compare(sweeps, "baseline", "rerun", capsys)
    assert code == 0 and not row["verdict"].startswith("slower"), printed
    assert row["verdict"] in ("same", "inconclusive") or drifted(row), printed


def expected_ratio(row) -> float:
    """The spin's known slowdown, from the baseline's own median."""
    base_ms = row["median_baseline_ms"]
    return (base_ms + (SPINS["candidate"] - SPINS["baseline"]) / 1000) / base_ms


def test_a_known_slowdown_is_slower(sweeps, capsys):
    """Unpaired: the direction only. Two sweeps timed apart can drift beyond what their machine
    probes show, so the size is held by the re-measured test."""
    code, row, printed = compare(sweeps, "baseline", "candidate", capsys)
    assert row["n_baseline"] >= MIN_ITERS and row["n_candidate"] >= MIN_ITERS
    assert row["ratio_ci_low"] <= row["ratio"] <= row["ratio_ci_high"]
    if drifted(row):  # e.g. the baseline timed under three times the load: --remeasure's test answers
        assert row["verdict"].startswith(("slower", "inconclusive")), printed
        return
    assert code == 1 and row["verdict"] == "slower" and "1 slower" in printed, printed
    assert row["ratio_ci_low"] > 1 + MIN_EFFECT


def test_the_sweeps_measured_what_they_were_given(sweeps):
    """Each sweep recorded the variant under the same name with the spin it was given, and
    only the first may have exported (the others found the entry in the shared cache)."""
    runs = sweeps["runs"]
    for name, run in runs.items():
        assert run.info.run_name == VARIANT and run.data.tags["status"] == "ok" and run.data.tags["parity"] == "passed"
        assert run.data.params["runtime.spin_us"] == str(SPINS[name])
        assert run.data.params["bench.threads"] == "1" and run.data.metrics["iterations"] >= MIN_ITERS
        assert run.data.metrics["machine_probe_us"] > 0
        # a runtime from outside the repository preloads in its fork server like ours (PRELOAD)
        # (absent where its fork server was not up in time and the benchmark was spawned)
        assert run.data.params.get("runtime.imports_after_fork", "none") == "none"
    assert runs["rerun"].data.tags["export_cache_hit"] == "True"
    assert runs["candidate"].data.tags["export_cache_hit"] == "True"
    # the spin is wall-clock time inside every timed call: no quieter machine takes it away
    assert runs["candidate"].data.metrics["latency_ms_min"] >= SPINS["candidate"] / 1000
    assert runs["baseline"].data.metrics["latency_ms_min"] < runs["candidate"].data.metrics["latency_ms_min"]


# re-measured: both sides timed again here, alternating blocks of 4 calls (40 and 160 ms each)
REMEASURE = ["--remeasure", "--block-calls", "4", "--max-seconds", "30"]


@pytest.fixture
def spin_importable(monkeypatch):
    """The re-measurement's side processes import spin_runtime by name."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SPIN), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    monkeypatch.syspath_prepend(str(SPIN))


def test_remeasured_an_identical_rerun_is_never_slower(sweeps, capsys, spin_importable):
    code, row, printed = compare(sweeps, "baseline", "rerun", capsys, *REMEASURE)
    assert row["measured"].startswith("interleaved, ") and row["rounds"] >= 6, printed
    assert code == 0 and row["verdict"] in ("same", "inconclusive"), printed


def test_remeasured_a_known_slowdown_is_slower(sweeps, capsys, spin_importable):
    code, row, printed = compare(sweeps, "baseline", "candidate", capsys, *REMEASURE)
    assert row["measured"].startswith("interleaved, ") and "interleaved" in printed, printed
    assert code == 1 and row["verdict"] == "slower", printed
    assert row["ratio_ci_low"] <= row["ratio"] <= row["ratio_ci_high"] and row["ratio_ci_low"] > 1 + MIN_EFFECT
    expected = expected_ratio(row)
    assert row["ratio"] == pytest.approx(expected, rel=0.15), f"expected {expected:.3f}"


def test_an_a_b_pair_in_one_sweep_is_timed_interleaved(tmp_path, mlflow_db, cache_override, spin_importable):
    """hydra.launcher.pair=backend.options.spin_us with spin_us=40000,160000: both variants
    measured as usual, then the pair timed interleaved; its ratio on the candidate's run and
    in the sweep's summary."""
    from mlflow.tracking import MlflowClient

    from orchestrator.run.sweep import run_sweep

    uri = mlflow_db(tmp_path)
    common = [
        "model=llama", "phase=decode", "backend=spin", f"hydra.searchpath=[file://{SPIN / 'conf'}]",
        *SHAPE_OVERRIDES, *BENCH, cache_override, f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'mlartifacts'}",
    ]
    jobs = [[*common, f"backend.options.spin_us={us}"] for us in (SPIN_US, 4 * SPIN_US)]
    outcomes = run_sweep([compose(j) for j in jobs], jobs, tmp_path / "out", "pytest: a/b pair", grid={"pair": "backend.options.spin_us"})
    base, cand = (outcomes[i] for i in (0, 1))
    assert base.status == cand.status == "ok"
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(cand.run_id)
    assert run.data.tags["pair_baseline"] == base.name and run.data.tags["pair_verdict"] == "slower", run.data.tags
    assert run.data.metrics["pair_ratio_ci_low"] > 1 + MIN_EFFECT and run.data.metrics["pair_rounds"] >= 6
    parent = run.data.tags["mlflow.parentRunId"]
    summary = Path(client.download_artifacts(parent, "summary.txt", str(tmp_path))).read_text()
    assert "A/B pairs, timed interleaved" in summary and cand.name in summary
