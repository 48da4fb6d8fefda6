"""The regression verdict: two sweeps compared variant by variant on their raw latency samples.

    python -m orchestrator.read.compare                         # the latest two sweeps of ./mlflow.db
    python -m orchestrator.read.compare BASELINE CANDIDATE      # sweep run ids, or experiment names
    python -m orchestrator.read.compare A B --min-effect 0.05 --alpha 0.05 --uri sqlite:///x/mlflow.db

For every variant (child run that ended ok, matched by run name) of both sweeps, from the
`latency_samples.json` artifacts (in the order they were timed): the ratio of medians
candidate / baseline, its 95% block-bootstrap interval, and a two-sided Mann-Whitney U
p-value of the runs' block medians, Holm-corrected across the variants. Each run is cut into
20 contiguous blocks, the unit of both: consecutive calls share the machine's state, so
single calls are not independent samples.

    slower        the whole interval lies above 1 + min_effect, and the corrected p < alpha
    faster        the whole interval lies below 1 - min_effect, and the corrected p < alpha
    same          the whole interval lies within [1 - min_effect, 1 + min_effect]
    inconclusive  anything else: measure more, or accept a coarser min_effect

A variant measured on shared cores on either side (metric shared_cores), or whose runs'
machine-speed probes (metric machine_probe_us, tasks/measure/bench.py) differ by more than
min_effect, is called slower or faster only beyond 50% (its interval describes the noise
within each run, not a load or machine speed that came or went between the two sweeps);
`same` keeps the min-effect band; in between it is inconclusive, and the table says why.

Below the table, what changed inside each variant's artifact (tasks/export/_anatomy.py, from the runs'
anatomy.json): "+24 transposes", "aten.bmm no longer delegated", ops new or gone.

The table is printed and logged on the candidate's sweep run (compare.txt, compare.json, tag
compare.baseline). Exit status: 1 when any variant is slower, 0 otherwise, 2 on usage errors
(for example fewer than two sweeps to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.plan.config import TrackingCfg
from orchestrator.read.report import table
from orchestrator.record.store import resolve_uri
from tasks.export import _anatomy as anatomy

SAMPLES = "latency_samples.json"
BLOCKS = 20  # contiguous blocks per run: the unit of the bootstrap and of the rank test
SKETCH = 101  # quantiles kept per block
VERDICTS = ("slower", "faster", "same", "inconclusive")
# the minimum effect for a variant measured on shared cores (other processes took >5% of its
# cores' time during the timed window, tasks/measure/machine.py) or on a machine whose own speed
# changed between the runs (tasks/measure/bench.py's probe): within-run noise says nothing of a load
# or a speed that came or went between the two sweeps
DISTURBED_MIN_EFFECT = 0.5


class UsageError(Exception):
    """What the user asked for cannot be compared: exit status 2."""


# -- statistics (pure) ----------------------------------------------------------------------


def block_sketches(samples: np.ndarray, blocks: int = BLOCKS) -> np.ndarray:
    """(k, SKETCH) array: `samples`, in the order they were timed, cut into k = min(blocks, n)
    contiguous blocks of (nearly) equal size, each summarised by SKETCH evenly spaced quantiles.

    The block is the unit of resampling and testing: consecutive calls share the machine's
    state (a core that runs at another speed for a second moves hundreds of calls together),
    so single calls are not independent and would make intervals too narrow and p-values far
    too small. The sketch keeps a resample's median to within a quantile step of the median of
    the blocks' raw samples at a fixed cost, whatever the sample count."""
    x = np.asarray(samples, dtype=np.float64)
    k = max(1, min(blocks, x.size))
    q = np.linspace(0, 1, SKETCH)
    return np.stack([np.quantile(b, q) for b in np.array_split(x, k)])


def block_bootstrap_medians(sketches: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of `resamples` non-overlapping block bootstrap resamples: k blocks drawn with
    replacement from the k of block_sketches(), the median of their pooled quantiles."""
    k = sketches.shape[0]
    drawn = sketches[rng.integers(0, k, (resamples, k))]  # (resamples, k, SKETCH)
    return np.median(drawn.reshape(resamples, -1), axis=1)


def verdict(
    ci_low: float,
    ci_high: float,
    p: float,
    min_effect: float = 0.05,
    alpha: float = 0.05,
    call: float | None = None,
    speed: float = 1.0,
) -> str:
    """slower / faster / same / inconclusive from the ratio's interval and a (corrected) p-value.

    `faster` mirrors `slower` additively (interval below 1 - min_effect), so `same` is the band
    [1 - min_effect, 1 + min_effect] and an effect counts once it leaves it either way.
    `call` (default min_effect) is the effect a slower/faster verdict needs: larger for runs on
    shared cores, while `same` keeps the min_effect band (in between: inconclusive).
    `speed` (the candidate's machine-speed probe over the baseline's, for a disturbed variant)
    is a change the machine made by itself: a verdict must go beyond it by min_effect too (a
    probe 2x slower in the candidate's run explains a 2x slower candidate)."""
    call = min_effect if call is None else call
    if ci_low > max(1 + call, speed * (1 + min_effect)) and p < alpha:
        return "slower"
    if ci_high < min(1 - call, speed * (1 - min_effect)) and p < alpha:
        return "faster"
    if 1 - min_effect <= ci_low and ci_high <= 1 + min_effect:
        return "same"
    return "inconclusive"


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input's order: the i-th smallest (from 1) of
    m is multiplied by m - i + 1, kept monotone, capped at 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def compare_samples(
    baseline_ns: Sequence[int] | np.ndarray,
    candidate_ns: Sequence[int] | np.ndarray,
    min_effect: float = 0.05,
    alpha: float = 0.05,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Candidate against baseline, one variant, from samples in the order they were timed:
    ratio of medians (candidate / baseline), its block-bootstrap percentile interval, the
    two-sided Mann-Whitney U p-value of the blocks' medians, and the verdict for that p as
    is (compare_sweeps re-judges it after the Holm correction across variants). Blocks, not
    calls, are resampled and ranked: see block_sketches()."""
    from scipy.stats import mannwhitneyu

    a = np.asarray(baseline_ns, dtype=np.float64)
    b = np.asarray(candidate_ns, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("both sides need at least one sample")
    med_a, med_b = float(np.median(a)), float(np.median(b))
    sk_a, sk_b = block_sketches(a), block_sketches(b)
    rng = np.random.default_rng(seed)
    boot_a = block_bootstrap_medians(sk_a, rng, resamples)
    boot_b = block_bootstrap_medians(sk_b, rng, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = boot_b / boot_a
    tail = (1 - confidence) / 2 * 100
    low, high = (float(v) for v in np.nanpercentile(ratios, [tail, 100 - tail]))
    ratio = med_b / med_a if med_a > 0 else float("inf")
    low, high = min(low, ratio), max(high, ratio)  # the sketch's quantile steps can leave it a hair outside
    mid = SKETCH // 2  # each block's median
    p = float(mannwhitneyu(sk_a[:, mid], sk_b[:, mid], alternative="two-sided").pvalue)
    if not np.isfinite(p):
        p = 1.0
    return {
        "n_baseline": int(a.size),
        "n_candidate": int(b.size),
        "blocks": [int(sk_a.shape[0]), int(sk_b.shape[0])],
        "median_baseline_ms": med_a / 1e6,
        "median_candidate_ms": med_b / 1e6,
        "ratio": ratio,
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "p_value": p,
        "verdict": verdict(low, high, p, min_effect, alpha),
    }


def compare_sweeps(
    baseline: dict[str, Sequence[int]],
    candidate: dict[str, Sequence[int]],
    min_effect: float = 0.05,
    alpha: float = 0.05,
    resamples: int = 2000,
    seed: int = 0,
    disturbed: Mapping[str, str] | None = None,
    speeds: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """{variant: samples} of two sweeps -> per-variant comparisons (Holm across the variants in
    both, `p_holm` and the final `verdict`) and the variants only one sweep has.

    A variant in `disturbed` ({name: why}, see disturbance()) is called slower or faster only
    beyond DISTURBED_MIN_EFFECT: the interval of each run describes the noise within that run,
    not a load or a machine speed that changed between the two, so only a large change is
    called, and only one beyond the machine's own speed change (`speeds`, {name: the
    candidate's probe / the baseline's}, see speed_change()); `same` still needs the
    min_effect band."""
    disturbed, speeds = disturbed or {}, speeds or {}
    common = sorted(set(baseline) & set(candidate))
    results = [
        {"variant": name, **compare_samples(baseline[name], candidate[name], min_effect, alpha, resamples, seed)}
        for name in common
    ]
    for r, p in zip(results, holm([r["p_value"] for r in results]), strict=True):
        r["p_holm"] = p
        r["disturbed"] = disturbed.get(r["variant"])
        call, speed = (max(min_effect, DISTURBED_MIN_EFFECT), speeds.get(r["variant"], 1.0)) if r["disturbed"] else (min_effect, 1.0)
        r["verdict"] = verdict(r["ratio_ci_low"], r["ratio_ci_high"], p, min_effect, alpha, call, speed)
    return {
        "min_effect": min_effect,
        "alpha": alpha,
        "resamples": resamples,
        "variants": results,
        "only_in_baseline": sorted(set(baseline) - set(candidate)),
        "only_in_candidate": sorted(set(candidate) - set(baseline)),
    }


@dataclass(frozen=True)
class Conditions:
    """How one run's timed window went, from its metrics (tasks/measure/machine.py, tasks/measure/bench.py)."""

    shared_cores: bool = False  # other processes took more than 5% of the bench cores' time
    probe_us: float | None = None  # the machine-speed probe's median; None in runs from before it

    @classmethod
    def of(cls, metrics: Mapping[str, float]) -> Conditions:
        return cls(metrics.get("shared_cores", 0.0) >= 1, metrics.get("machine_probe_us"))


def speed_change(base: Conditions, cand: Conditions) -> float | None:
    """The candidate's machine-speed probe median over the baseline's (> 1: the machine ran
    the same code slower in the candidate's run); None when either run has no probe."""
    return cand.probe_us / base.probe_us if base.probe_us and cand.probe_us else None


def disturbance(base: Conditions, cand: Conditions, min_effect: float) -> str | None:
    """Why two runs' latencies may not compare, or None: the bench cores were shared in either,
    and/or the machine-speed probe's medians differ by more than min_effect (the same code ran
    at another speed: the change is the machine's, not the candidate's)."""
    why = ["shared cores"] if base.shared_cores or cand.shared_cores else []
    speed = speed_change(base, cand)
    if speed is not None and abs(speed - 1) > min_effect:
        why.append(f"machine speed {1 / speed:.2f}x")
    return "; ".join(why) or None


def disturbances(
    base: Mapping[str, Conditions], cand: Mapping[str, Conditions], min_effect: float
) -> tuple[dict[str, str], dict[str, float]]:
    """compare_sweeps' `disturbed` and `speeds` from each variant's conditions in both sweeps:
    why each disturbed variant's runs may not compare, and the machine's speed change for those."""
    disturbed = {name: why for name in set(base) & set(cand) if (why := disturbance(base[name], cand[name], min_effect))}
    speeds = {name: speed for name in disturbed if (speed := speed_change(base[name], cand[name])) is not None}
    return disturbed, speeds


def compare_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """The table's rows: one per compared variant, then one per variant only one sweep has."""
    rows = [
        {
            "variant": r["variant"],
            "baseline_ms": f"{r['median_baseline_ms']:.4g}",
            "candidate_ms": f"{r['median_candidate_ms']:.4g}",
            "ratio": f"{r['ratio']:.3f}",
            "ratio_95ci": f"[{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}]",
            "p_holm": f"{r['p_holm']:.2g}",
            "verdict": r["verdict"] + (f" ({r['disturbed']})" if r.get("disturbed") else ""),
        }
        for r in report["variants"]
    ]
    for side in ("baseline", "candidate"):
        for name in report[f"only_in_{side}"]:
            rows.append(
                {"variant": name, "baseline_ms": "-", "candidate_ms": "-", "ratio": "-", "ratio_95ci": "-"}
                | {"p_holm": "-", "verdict": f"only in {side}"}
            )
    return rows


def summary_line(report: dict[str, Any]) -> str:
    counts = {v: sum(r["verdict"] == v for r in report["variants"]) for v in VERDICTS}
    text = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "nothing compared"
    slower = [r["variant"] for r in report["variants"] if r["verdict"] == "slower"]
    return f"{len(report['variants'])} variants compared: {text}" + (
        f" (slower: {', '.join(slower)})" if slower else ""
    )


# -- MLflow ------------------------------------------------------------------------------------


def latest_sweeps(client: Any, experiment: str, count: int = 2) -> list[str]:
    """The last `count` sweep (parent) run ids of an experiment, oldest first."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise UsageError(f"no MLflow experiment named {experiment!r}")
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string="tags.`phasesweep.role` = 'sweep'",
        order_by=["attributes.start_time DESC"],
        max_results=count,
    )
    return [r.info.run_id for r in reversed(runs)]


def resolve_sweep(client: Any, ref: str) -> str:
    """A sweep run id as given, or the latest sweep of the experiment named `ref`."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(ref)
    except MlflowException:
        run = None
    if run is not None:
        if run.data.tags.get("phasesweep.role") == "variant" or "mlflow.parentRunId" in run.data.tags:
            raise UsageError(f"run {ref} is a variant's run; give its sweep (parent) run instead")
        return run.info.run_id
    if client.get_experiment_by_name(ref) is None:
        raise UsageError(f"{ref!r} is neither a run id nor an MLflow experiment name")
    found = latest_sweeps(client, ref, 1)
    if not found:
        raise UsageError(f"experiment {ref!r} has no sweep runs")
    return found[0]


def _reused_runs(client: Any, parent_run_id: str, dst: Path) -> list[Any]:
    """The earlier runs a resumed sweep reused (its parent's reused.json: name -> run id)."""
    try:
        local = client.download_artifacts(parent_run_id, "reused.json", str(dst / parent_run_id))
    except Exception:
        return []
    return [client.get_run(run_id) for run_id in json.loads(Path(local).read_text()).values()]


def _ok_runs(client: Any, parent_run_id: str, dst: Path) -> list[Any]:
    """One sweep's variant runs that ended ok, newest first: its child runs, then the earlier
    runs it reused."""
    parent = client.get_run(parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.status = 'ok'",
        order_by=["attributes.start_time DESC"],
        max_results=10_000,
    )
    return list(runs) + _reused_runs(client, parent_run_id, dst)


def sweep_anatomies(client: Any, runs: list[Any], dst: Path) -> dict[str, dict]:
    """{variant name: tasks.export._anatomy of its artifact} of one sweep's ok variant runs (_ok_runs)
    that have one."""
    found: dict[str, dict] = {}
    for run in runs:
        name = run.info.run_name
        if name in found or "anatomy_nodes" not in run.data.metrics:  # eager, compile: no artifact
            continue
        try:
            local = client.download_artifacts(run.info.run_id, anatomy.ARTIFACT, str(dst / run.info.run_id))
            found[name] = json.loads(Path(local).read_text())
        except Exception:  # a run from before anatomies were recorded
            continue
    return found


def anatomy_lines(changes: Mapping[str, list[str]]) -> list[str]:
    """What changed inside the artifacts, one line per variant whose artifact changed."""
    if not changes:
        return []
    return ["", "inside the artifacts (baseline -> candidate):"] + [
        f"  {name}: {', '.join(words)}" for name, words in sorted(changes.items())
    ]


def sweep_samples(
    client: Any, runs: list[Any], dst: Path
) -> tuple[dict[str, np.ndarray], list[str], dict[str, Conditions]]:
    """{variant name: samples in ns, in the order timed} of one sweep's variant runs that ended
    ok (_ok_runs: its child runs and the earlier runs it reused), the names of those without a
    readable samples artifact, and each variant's Conditions."""
    samples: dict[str, np.ndarray] = {}
    missing = []
    conditions: dict[str, Conditions] = {}
    for run in runs:  # newest first: a variant recorded twice counts by its latest run
        name = run.info.run_name
        if name in samples or name in missing:
            continue
        try:
            local = client.download_artifacts(run.info.run_id, SAMPLES, str(dst / run.info.run_id))
            data = json.loads(Path(local).read_text())
            if data.get("unit", "ns") != "ns" or not data["samples"]:
                raise ValueError(f"unexpected {SAMPLES}: unit {data.get('unit')!r}, {len(data['samples'])} samples")
            samples[name] = np.asarray(data["samples"], dtype=np.int64)
            conditions[name] = Conditions.of(run.data.metrics)
        except Exception:
            missing.append(name)
    return samples, sorted(missing), conditions


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.read.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("sweeps", nargs="*", metavar="BASELINE CANDIDATE", help="sweep run ids or experiment names")
    p.add_argument("--uri", default=None, help="MLflow tracking URI (default: sqlite:///$PWD/mlflow.db)")
    p.add_argument("--experiment", default=TrackingCfg().experiment, help="where to find the latest two sweeps")
    p.add_argument("--min-effect", type=float, default=0.05, help="smallest relative change that matters")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level after the Holm correction")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples per variant")
    args = p.parse_args(argv)
    try:
        if len(args.sweeps) not in (0, 2):
            raise UsageError("give both BASELINE and CANDIDATE, or neither (the latest two sweeps)")
        if not (args.min_effect > 0 and 0 < args.alpha < 1 and args.resamples > 0):
            raise UsageError("need --min-effect > 0, 0 < --alpha < 1 and --resamples > 0")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per variant otherwise
        from mlflow.tracking import MlflowClient

        uri = args.uri or resolve_uri(TrackingCfg())
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise UsageError(f"no MLflow store at {uri} (run a sweep first, or pass --uri)")
        client = MlflowClient(tracking_uri=uri)
        if args.sweeps:
            base_id, cand_id = (resolve_sweep(client, ref) for ref in args.sweeps)
        else:
            found = latest_sweeps(client, args.experiment)
            if len(found) < 2:
                raise UsageError(f"need two sweeps to compare, found {len(found)} in {args.experiment!r} at {uri}")
            base_id, cand_id = found
        if base_id == cand_id:
            raise UsageError(f"baseline and candidate are the same sweep ({base_id})")
        with tempfile.TemporaryDirectory(prefix="phasesweep-compare-") as tmp:
            base_runs, cand_runs = (_ok_runs(client, run_id, Path(tmp)) for run_id in (base_id, cand_id))
            base, base_missing, base_cond = sweep_samples(client, base_runs, Path(tmp))
            cand, cand_missing, cand_cond = sweep_samples(client, cand_runs, Path(tmp))
            base_anatomy = sweep_anatomies(client, base_runs, Path(tmp))
            cand_anatomy = sweep_anatomies(client, cand_runs, Path(tmp))
    except UsageError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2

    disturbed, speeds = disturbances(base_cond, cand_cond, args.min_effect)
    report = compare_sweeps(
        base, cand, args.min_effect, args.alpha, args.resamples, disturbed=disturbed, speeds=speeds
    )
    report.update(
        baseline=base_id, candidate=cand_id, without_samples={"baseline": base_missing, "candidate": cand_missing}
    )
    report["anatomy_changes"] = {
        name: words
        for name in sorted(set(base_anatomy) & set(cand_anatomy))
        if (words := anatomy.changes(base_anatomy[name], cand_anatomy[name]))
    }
    lines = [
        f"baseline  = {base_id}",
        f"candidate = {cand_id}",
        f"ratio = candidate / baseline median; 95% block-bootstrap interval; Mann-Whitney U p of "
        f"{BLOCKS} blocks per run, Holm-corrected; "
        f"min effect {args.min_effect:.0%}, alpha {args.alpha:g}",
        "",
        table(compare_rows(report)),
        "",
        summary_line(report),
        *anatomy_lines(report["anatomy_changes"]),
    ]
    for side, names in (("baseline", base_missing), ("candidate", cand_missing)):
        if names:
            lines.append(f"without {SAMPLES} in the {side}: {', '.join(names)}")
    text = "\n".join(lines)
    print(text)
    client.log_text(cand_id, text + "\n", "compare.txt")
    client.log_text(cand_id, json.dumps(report, indent=1), "compare.json")
    client.set_tag(cand_id, "compare.baseline", base_id)
    return 1 if any(r["verdict"] == "slower" for r in report["variants"]) else 0


if __name__ == "__main__":
    sys.exit(main())
