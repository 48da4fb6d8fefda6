"""The regression verdict: its statistics on synthetic samples, and its MLflow I/O on a temporary store."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.compare import main
from orchestrator.read.stats import (
    Conditions,
    block_bootstrap_medians,
    block_sketches,
    compare_samples,
    compare_sweeps,
    disturbance,
    disturbances,
    holm,
    speed_change,
    verdict,
)


def stalls(rng, n: int, median_ms: float = 0.07, stall_rate: float = 0.005, sigma: float = 0.03) -> np.ndarray:
    """Tiny-model calls as this machine measures them: lognormal around the median, plus rare
    4-12 ms stalls (std/mean of 33-292% while MAD/median is a few percent)."""
    ms = median_ms * rng.lognormal(0, sigma, n)
    hit = rng.random(n) < stall_rate
    ms[hit] = rng.uniform(4, 12, hit.sum())
    return (ms * 1e6).astype(np.int64)


def cv(x) -> float:
    return float(np.std(x, ddof=1) / np.mean(x))


@pytest.mark.parametrize("seed", range(5))
def test_identical_distributions_are_never_slower(seed):
    rng = np.random.default_rng(seed)
    a, b = stalls(rng, 2000), stalls(rng, 2000)
    r = compare_samples(a, b, seed=seed)
    assert r["verdict"] == "same" and abs(r["ratio"] - 1) < 0.01 and r["ratio_ci_high"] - r["ratio_ci_low"] < 0.01
    wide = compare_samples(rng.lognormal(0, 0.3, 2000) * 1e6, rng.lognormal(0, 0.3, 2000) * 1e6, seed=seed)
    assert wide["verdict"] in ("same", "inconclusive")


def test_many_identical_variants_give_no_slower_after_holm():
    rng = np.random.default_rng(42)
    base = {f"v{i}": stalls(rng, 2000, sigma=0.2) for i in range(12)}
    cand = {f"v{i}": stalls(rng, 2000, sigma=0.2) for i in range(12)}
    report = compare_sweeps(base, cand)
    assert not [r for r in report["variants"] if r["verdict"] in ("slower", "faster")]
    assert all(r["p_holm"] >= r["p_value"] for r in report["variants"])


def test_thirty_percent_slower_is_slower_with_the_right_ratio():
    covered = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        r = compare_samples(stalls(rng, 2000), stalls(rng, 2000, median_ms=0.07 * 1.3), seed=seed)
        # 20 blocks a side, all of the candidate's above all of the baseline's: p ~ 6e-8
        assert r["verdict"] == "slower" and r["ratio"] == pytest.approx(1.3, abs=0.01) and r["p_value"] < 1e-6
        assert r["ratio_ci_high"] - r["ratio_ci_low"] < 0.02
        covered += r["ratio_ci_low"] <= 1.3 <= r["ratio_ci_high"]
    assert covered >= 17  # a 95% interval: it holds the true ratio in about 19 of 20 draws


def test_three_times_slower_is_slower_however_heavy_the_tail():
    rng = np.random.default_rng(7)
    a = stalls(rng, 2000, stall_rate=0.01)
    b = stalls(rng, 2000, stall_rate=0.01) * 3  # everything 3x slower, the stalls too
    assert cv(a) > 3 and cv(b) > 3  # the old rule called |ratio - 1| <= max CV "within noise"
    r = compare_samples(a, b)
    assert abs(r["ratio"] - 1) <= max(cv(a), cv(b))
    assert r["verdict"] == "slower" and r["ratio"] == pytest.approx(3.0, abs=0.05)


def test_faster_and_inconclusive():
    rng = np.random.default_rng(3)
    fast = compare_samples(stalls(rng, 2000), stalls(rng, 2000, median_ms=0.07 * 0.7))
    assert fast["verdict"] == "faster" and fast["ratio_ci_high"] < 0.95
    # a 4% shift measured on wide samples: real (p small), but its interval straddles 1.05
    a, b = rng.lognormal(0, 0.3, 2000) * 1e6, rng.lognormal(0, 0.3, 2000) * 1.04e6
    small = compare_samples(a, b)
    assert small["ratio_ci_low"] < 1.05 < small["ratio_ci_high"] and small["verdict"] == "inconclusive"


def test_verdict_rules():
    assert verdict(1.10, 1.20, 0.01) == "slower"
    assert verdict(1.10, 1.20, 0.20) == "inconclusive"  # big, but not significant after correction
    assert verdict(1.02, 1.20, 0.001) == "inconclusive"  # could be below the smallest effect that matters
    assert verdict(0.80, 0.90, 0.001) == "faster"
    assert verdict(0.97, 1.03, 0.001) == "same"  # significant yet too small to matter
    assert verdict(0.97, 1.03, 0.5, min_effect=0.02) == "inconclusive"


def test_holm_matches_a_hand_computed_example():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> kept monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0] and holm([0.02]) == [0.02] and holm([]) == []


def test_block_bootstrap_medians_follow_resampling_the_raw_blocks():
    rng = np.random.default_rng(0)
    x = rng.lognormal(0, 0.5, 2000) * (1 + (np.arange(2000) // 400) * 0.2)  # drifting in time
    sketches = block_sketches(x)
    assert sketches.shape == (20, 101)
    drawn = block_bootstrap_medians(sketches, rng, 20_000)
    raw = np.array_split(x, 20)
    brute = [np.median(np.concatenate([raw[i] for i in rng.integers(0, 20, 20)])) for _ in range(5000)]
    assert np.percentile(drawn, [2.5, 50, 97.5]) == pytest.approx(np.percentile(brute, [2.5, 50, 97.5]), rel=0.01)
    assert block_sketches(np.arange(5.0)).shape == (5, 101)  # fewer samples than blocks: a block each


def flipping(rng, n: int, median_ms: float = 0.3, segment: int = 150) -> np.ndarray:
    """Calls on a machine whose core flips between two speeds (1x, 1.8x) for stretches of
    `segment` calls, as the development VM's does. Within a run, blocks see such flips when
    the run holds many of them; a run that holds one or two (the VM flips about once a
    second) is the machine-speed probe's to flag (test_disturbances)."""
    speed = np.repeat(rng.choice([1.0, 1.8], n // segment + 1), segment)[:n]
    return (median_ms * speed * rng.lognormal(0, 0.03, n) * 1e6).astype(np.int64)


def test_a_machine_that_changes_speed_is_not_a_regression():
    """Identical code timed on a flipping machine: calls judged one by one (as if independent)
    find a 'significant' difference in most draws; blocks see the drift and do not call it."""
    from scipy.stats import mannwhitneyu

    called, naive = 0, 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        a, b = flipping(rng, 3000), flipping(rng, 3000)
        r = compare_samples(a, b, seed=seed)
        called += r["verdict"] in ("slower", "faster")
        naive += mannwhitneyu(a, b).pvalue < 1e-6 and abs(np.median(b) / np.median(a) - 1) > 0.05
    assert naive >= 5 and called == 0, (naive, called)


def test_disturbances():
    quiet = Conditions(probe_us=100.0)
    assert disturbance(quiet, Conditions(probe_us=103.0), 0.05) is None
    assert disturbance(quiet, Conditions(probe_us=125.0), 0.05) == "machine speed 0.80x"
    assert disturbance(Conditions(probe_us=125.0), quiet, 0.05) == "machine speed 1.25x"
    assert disturbance(quiet, Conditions(shared_cores=True, probe_us=100.0), 0.05) == "shared cores"
    assert disturbance(quiet, Conditions(shared_cores=True, probe_us=200.0), 0.05) == "shared cores; machine speed 0.50x"
    assert speed_change(quiet, Conditions(probe_us=200.0)) == 2.0 and speed_change(Conditions(), quiet) is None
    assert disturbance(Conditions(), quiet, 0.05) is None  # a run from before the probe: nothing to judge by
    assert Conditions.of({"shared_cores": 1.0, "machine_probe_us": 80.0}) == Conditions(True, 80.0)
    # a disturbed variant needs a 50% change to be called; same stays the min-effect band
    rng = np.random.default_rng(1)
    base, cand = {"v": stalls(rng, 2000)}, {"v": stalls(rng, 2000, median_ms=0.07 * 1.3)}
    assert compare_sweeps(base, cand)["variants"][0]["verdict"] == "slower"
    (row,) = compare_sweeps(base, cand, disturbed={"v": "machine speed 0.80x"})["variants"]
    assert row["verdict"] == "inconclusive" and row["disturbed"] == "machine speed 0.80x"


def test_hundred_thousand_samples_compare_fast():
    import time

    rng = np.random.default_rng(0)
    a, b = stalls(rng, 100_000), stalls(rng, 100_000)
    t0 = time.perf_counter()
    r = compare_samples(a, b)
    assert time.perf_counter() - t0 < 5 and r["verdict"] == "same"


def test_compare_imports_no_torch():
    code = "import sys, orchestrator.compare; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- MLflow I/O on a temporary store ------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("phasesweep", artifact_location=(root / "artifacts").as_uri())
    t = [1_700_000_000_000]

    def sweep(
        variants: dict[str, np.ndarray],
        failed: tuple[str, ...] = (),
        experiment: str = exp,
        probe_us: float = 100.0,
        anatomies: dict[str, dict] | None = None,
    ) -> str:
        t[0] += 60_000
        parent = client.create_run(experiment, start_time=t[0], run_name="sweep", tags={"phasesweep.role": "sweep"})
        pid = parent.info.run_id
        for name, samples in variants.items():
            status = "failed" if name in failed else "ok"
            tags = {"mlflow.parentRunId": pid, "phasesweep.role": "variant", "status": status}
            child = client.create_run(experiment, start_time=t[0] + 1, run_name=name, tags=tags)
            payload = {"variant": name, "unit": "ns", "first_call_ns": 10**7, "samples": samples.tolist()}
            client.log_text(child.info.run_id, json.dumps(payload), "latency_samples.json")
            client.log_metric(child.info.run_id, "machine_probe_us", probe_us)
            if anatomies and name in anatomies:  # as the sweep logs it: a metric says there is one
                client.log_metric(child.info.run_id, "anatomy_nodes", anatomies[name]["nodes"])
                client.log_text(child.info.run_id, json.dumps(anatomies[name]), "anatomy.json")
            client.set_terminated(child.info.run_id)
        client.set_terminated(pid)
        return pid

    return uri, client, sweep


def test_compare_two_sweeps_end_to_end(store, capsys):
    uri, client, sweep = store
    rng = np.random.default_rng(0)
    decode, prefill = "llama_decode_onnxruntime_cpu", "llama_prefill_onnxruntime_cpu"
    base = sweep({decode: stalls(rng, 2000), prefill: stalls(rng, 2000, 1.4), "old_only": stalls(rng, 50)})
    cand = sweep(
        {
            decode: stalls(rng, 2000),
            prefill: stalls(rng, 2000, 1.4 * 1.3),
            "new_only": stalls(rng, 50),
            "broken": stalls(rng, 50),
        },
        failed=("broken",),
    )
    assert main([base, cand, "--uri", uri]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("llama_", "old_", "new_"))}
    assert rows[prefill].split()[-1] == "slower" and rows[decode].split()[-1] == "same"
    assert rows["old_only"].endswith("only in baseline") and rows["new_only"].endswith("only in candidate")
    assert "broken" not in out and "(slower: llama_prefill_onnxruntime_cpu)" in out

    logged = client.get_run(cand)
    assert logged.data.tags["compare.baseline"] == base
    text = open(client.download_artifacts(cand, "compare.txt")).read()
    assert "slower" in text and prefill in text
    report = json.loads(open(client.download_artifacts(cand, "compare.json")).read())
    found = {r["variant"]: r for r in report["variants"]}
    assert found[prefill]["ratio_ci_low"] <= 1.3 <= found[prefill]["ratio_ci_high"]
    assert report["baseline"] == base and report["only_in_candidate"] == ["new_only"]

    # a rerun that did not regress: the latest two sweeps, found by default, exit 0
    again = sweep({decode: stalls(rng, 2000), prefill: stalls(rng, 2000, 1.4 * 1.3)})
    assert main(["--uri", uri]) == 0
    assert client.get_run(again).data.tags["compare.baseline"] == cand
    # an experiment name stands for its latest sweep
    assert main([cand, "phasesweep", "--uri", uri]) == 0
    capsys.readouterr()
    # the same 30% on a machine that ran 40% slower (its speed probe says so): not called
    slow_machine = sweep({decode: stalls(rng, 2000), prefill: stalls(rng, 2000, 1.4 * 1.3)}, probe_us=140.0)
    assert main([base, slow_machine, "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert "inconclusive (machine speed 0.71x)" in out and "0 slower" not in out


def test_what_changed_inside_the_artifacts_is_shown_under_the_table(store, capsys):
    """A module swap that adds transposes and takes an op out of XNNPACK: named per variant."""
    from collections import Counter

    from tasks.export._anatomy import summary

    uri, client, sweep = store
    rng = np.random.default_rng(1)
    name = "llama_decode_executorch_cpu"
    xnn = {"backend": "XnnpackBackend", "ops": {"aten.bmm": 2, "aten.permute_copy": 2}}
    before = summary(Counter({"aten.bmm": 2, "aten.permute_copy": 2}), Counter(), [xnn], 1000, 5000)
    after = summary(
        Counter({"aten.bmm": 2, "aten.permute_copy": 4}),
        Counter({"aten.bmm": 2}),
        [{"backend": "XnnpackBackend", "ops": {"aten.permute_copy": 4}}],
        1000,
        5000,
    )
    base = sweep({name: stalls(rng, 500), "eager_only": stalls(rng, 500)}, anatomies={name: before})
    cand = sweep({name: stalls(rng, 500), "eager_only": stalls(rng, 500)}, anatomies={name: after})
    main([base, cand, "--uri", uri])
    out = capsys.readouterr().out
    assert "inside the artifacts (baseline -> candidate):" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"  {name}: ")]
    assert line == f"  {name}: +2 ops, +2 transposes, aten.bmm no longer delegated, aten.permute_copy +2"
    report = json.loads(open(client.download_artifacts(cand, "compare.json")).read())
    assert list(report["anatomy_changes"]) == [name]  # eager_only has no artifact: nothing to say
    # an unchanged artifact says nothing
    again = sweep({name: stalls(rng, 500)}, anatomies={name: after})
    main([cand, again, "--uri", uri])
    assert "inside the artifacts" not in capsys.readouterr().out


def test_usage_errors_exit_2(store, capsys):
    uri, client, sweep = store
    lonely = client.create_experiment("lonely")
    only = sweep({"v": np.arange(1, 100)}, experiment=lonely)
    assert main(["--uri", uri, "--experiment", "lonely"]) == 2
    assert "need two sweeps to compare, found 1" in capsys.readouterr().err
    assert main([only, "--uri", uri]) == 2  # one of the two
    assert main(["lonely", "lonely", "--uri", uri]) == 2  # the same sweep twice
    assert main([only, "no-such-thing", "--uri", uri]) == 2
    assert "neither a run id nor an experiment name" in capsys.readouterr().err
    child = client.search_runs([lonely], filter_string=f"tags.mlflow.parentRunId = '{only}'")[0].info.run_id
    assert main([only, child, "--uri", uri]) == 2
    assert "is not a sweep run (variant)" in capsys.readouterr().err


def test_shared_cores_need_a_large_effect_to_call_and_never_make_same_easier():
    from orchestrator.read.stats import DISTURBED_MIN_EFFECT, verdict

    # a tight 25% slowdown: slower on quiet cores, inconclusive on shared ones
    assert verdict(1.24, 1.26, 1e-9, 0.05, 0.05) == "slower"
    assert verdict(1.24, 1.26, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT) == "inconclusive"
    assert verdict(1.9, 2.1, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT) == "slower"  # 2x is called anyway
    # "same" keeps the min-effect band whatever the cores
    assert verdict(0.99, 1.01, 0.5, 0.05, 0.05, call=DISTURBED_MIN_EFFECT) == "same"
    assert verdict(0.74, 0.76, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT) == "inconclusive"


def test_a_change_the_machine_made_itself_is_not_the_candidates():
    """Seen in the suite beside a sweep: the same graph measured twice, the candidate on shared
    cores while the machine-speed probe ran 1.97x slower too, and its latency 1.96x: called
    slower by the 50% rule alone. A disturbed verdict must also go beyond the probe's change."""
    from orchestrator.read.stats import DISTURBED_MIN_EFFECT, verdict

    assert verdict(1.6, 2.02, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT) == "slower"
    assert verdict(1.6, 2.02, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT, speed=1.97) == "inconclusive"
    assert verdict(2.2, 2.4, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT, speed=1.97) == "slower"  # beyond it
    assert verdict(2.2, 2.4, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT, speed=0.5) == "slower"  # a faster machine hides nothing
    assert verdict(0.46, 0.49, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT, speed=0.5) == "inconclusive"
    assert verdict(0.40, 0.45, 1e-9, 0.05, 0.05, call=DISTURBED_MIN_EFFECT, speed=0.5) == "faster"
    rng = np.random.default_rng(3)
    base, cand = {"v": stalls(rng, 4000)}, {"v": stalls(rng, 1000, median_ms=0.07 * 1.96)}
    (row,) = compare_sweeps(base, cand, disturbed={"v": "shared cores; machine speed 0.51x"})["variants"]
    assert row["verdict"] == "slower"
    (row,) = compare_sweeps(base, cand, disturbed={"v": "shared cores; machine speed 0.51x"}, speeds={"v": 1.97})["variants"]
    assert row["verdict"] == "inconclusive"
    (row,) = compare_sweeps(base, cand, speeds={"v": 1.97})["variants"]  # not disturbed: the speed is not used
    assert row["verdict"] == "slower"
    quiet, slow = Conditions(probe_us=58.8), Conditions(shared_cores=True, probe_us=116.0)
    assert disturbances({"v": quiet, "w": quiet}, {"v": slow, "w": quiet}, 0.05) == (
        {"v": "shared cores; machine speed 0.51x"}, {"v": pytest.approx(116.0 / 58.8)}
    )
