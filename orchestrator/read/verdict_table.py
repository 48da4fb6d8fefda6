"""Two sweeps compared variant by variant from their runs in MLflow (the statistics: stats.py),
printed and logged on the candidate's sweep run (compare.txt, compare.json, tag compare.baseline)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.common.console import table
from orchestrator.read.quality_compare import quality_cell, quality_changes, quality_summary
from orchestrator.read.stats import BLOCKS, VERDICTS, Conditions, compare_sweeps, disturbances
from orchestrator.read.store import UsageError, artifact_json, find_sweep, latest_sweeps, variant_runs
from tasks.measure import anatomy

SAMPLES = "latency_samples.json"


def pick_sweeps(client: Any, refs: Sequence[str], experiment: str) -> tuple[str, str]:
    """(baseline, candidate) sweep run ids: the two `refs` (store.find_sweep), or the latest two
    sweeps of `experiment`."""
    if refs:
        base, cand = (find_sweep(client, ref).info.run_id for ref in refs)
    else:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise UsageError(f"no MLflow experiment named {experiment!r}")
        found = [r.info.run_id for r in latest_sweeps(client, [exp.experiment_id])]
        if len(found) < 2:
            raise UsageError(f"need two sweeps to compare, found {len(found)} in {experiment!r}")
        base, cand = found
    if base == cand:
        raise UsageError(f"baseline and candidate are the same sweep ({base})")
    return base, cand


def ok_runs(client: Any, sweep_id: str) -> dict[str, Any]:
    """{variant: its latest run that ended ok} of a sweep (its child runs and the runs it reused)."""
    found = [(n, r) for n, r, _ in variant_runs(client, client.get_run(sweep_id)) if r.data.tags.get("status") == "ok"]
    return dict(sorted(found, key=lambda nr: nr[1].info.start_time))


def sweep_samples(client: Any, runs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], list[str], dict[str, Conditions]]:
    """{variant: samples in ns, in timed order}, the variants without a readable SAMPLES artifact,
    and each variant's Conditions."""
    samples, missing, conditions = {}, [], {}
    for name, run in runs.items():
        try:
            data = artifact_json(client, run.info.run_id, SAMPLES)
            if not data or data.get("unit", "ns") != "ns" or not data["samples"]:
                raise ValueError(f"no usable {SAMPLES}")
            samples[name] = np.asarray(data["samples"], dtype=np.int64)
            conditions[name] = Conditions.of(run.data.metrics)
        except Exception:
            missing.append(name)
    return samples, sorted(missing), conditions


def sweep_anatomies(client: Any, runs: Mapping[str, Any]) -> dict[str, dict]:
    """{variant: tasks.measure.anatomy record of its artifact} of the runs that have one."""
    found = {}
    for name, run in runs.items():
        if "anatomy_nodes" in run.data.metrics:  # eager, compile: no artifact
            try:
                if (record := artifact_json(client, run.info.run_id, anatomy.ARTIFACT)) is not None:
                    found[name] = record
            except Exception:  # unreadable: nothing to show
                continue
    return found


def compare_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """One row per compared variant, then one per variant only one sweep has; a quality column
    when some variant has quality figures in both sweeps."""
    quality = report.get("quality") or {}
    rows = [
        {
            "variant": r["variant"],
            "baseline_ms": f"{r['median_baseline_ms']:.4g}",
            "candidate_ms": f"{r['median_candidate_ms']:.4g}",
            "ratio": f"{r['ratio']:.3f}",
            "ratio_95ci": f"[{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}]",
            "p_holm": f"{r['p_holm']:.2g}",
            "verdict": r["verdict"] + (f" ({r['disturbed']})" if r.get("disturbed") else ""),
            **({"measured": r.get("measured", "the sweeps' samples")} if report.get("remeasured") is not None else {}),
            **({"quality": quality_cell(quality.get(r["variant"]), r["verdict"])} if quality else {}),
        }
        for r in report["variants"]
    ]
    for side in ("baseline", "candidate"):
        for name in report[f"only_in_{side}"]:
            rows.append(
                {"variant": name, "baseline_ms": "-", "candidate_ms": "-", "ratio": "-", "ratio_95ci": "-"}
                | {"p_holm": "-", "verdict": f"only in {side}"}
                | ({"measured": "-"} if report.get("remeasured") is not None else {})  # table(): rows of equal keys
                | ({"quality": "-"} if quality else {})
            )
    return rows


def summary_line(report: dict[str, Any]) -> str:
    counts = {v: sum(r["verdict"] == v for r in report["variants"]) for v in VERDICTS}
    text = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "nothing compared"
    slower = [r["variant"] for r in report["variants"] if r["verdict"] == "slower"]
    return f"{len(report['variants'])} variants compared: {text}" + (
        f" (slower: {', '.join(slower)})" if slower else ""
    )


def anatomy_lines(changes: Mapping[str, list[str]]) -> list[str]:
    """What changed inside the artifacts, one line per variant whose artifact changed."""
    if not changes:
        return []
    return ["", "inside the artifacts (baseline -> candidate):"] + [
        f"  {name}: {', '.join(words)}" for name, words in sorted(changes.items())
    ]


def compare(
    client: Any,
    base_id: str,
    cand_id: str,
    min_effect: float,
    alpha: float,
    resamples: int,
    remeasured: tuple[dict[str, dict], dict[str, str]] | None = None,
) -> tuple[dict[str, Any], str]:
    """The comparison of two sweeps and its text, both logged on the candidate's sweep run.
    `remeasured`: ({variant: its interleaved re-measurement}, {variant: why not}) from
    orchestrator/run/remeasure.py; those variants are judged on the re-measurement."""
    base_runs, cand_runs = ok_runs(client, base_id), ok_runs(client, cand_id)
    base, base_missing, base_cond = sweep_samples(client, base_runs)
    cand, cand_missing, cand_cond = sweep_samples(client, cand_runs)
    disturbed, speeds = disturbances(base_cond, cand_cond, min_effect)
    pairs, missed = remeasured or ({}, {})
    report = compare_sweeps(base, cand, min_effect, alpha, resamples, disturbed=disturbed, speeds=speeds, paired=pairs)
    report.update(baseline=base_id, candidate=cand_id, without_samples={"baseline": base_missing, "candidate": cand_missing})
    if remeasured is not None:
        report["remeasured"] = {"variants": sorted(pairs), "not": missed}
    base_anatomy, cand_anatomy = sweep_anatomies(client, base_runs), sweep_anatomies(client, cand_runs)
    report["quality"] = quality_changes(base_runs, cand_runs)
    report["anatomy_changes"] = {
        name: words
        for name in sorted(set(base_anatomy) & set(cand_anatomy))
        if (words := anatomy.changes(base_anatomy[name], cand_anatomy[name]))
    }
    lines = [
        f"baseline  = {base_id}",
        f"candidate = {cand_id}",
        f"ratio = candidate / baseline median; 95% block-bootstrap interval; Mann-Whitney U p of "
        f"{BLOCKS} blocks per run, Holm-corrected; min effect {min_effect:.0%}, alpha {alpha:g}",
        *(["interleaved: the median of per-round ratios of block medians, its distribution-free 95% interval, "
           "a sign test's p"] if pairs else []),
        "",
        table(compare_rows(report)),
        "",
        summary_line(report),
        *quality_summary(report["quality"]),
        *anatomy_lines(report["anatomy_changes"]),
    ]
    if missed:
        lines += ["", "not re-measured (judged on the sweeps' samples):"] + [f"  {n}: {why}" for n, why in sorted(missed.items())]
    for side, names in (("baseline", base_missing), ("candidate", cand_missing)):
        if names:
            lines.append(f"without {SAMPLES} in the {side}: {', '.join(names)}")
    text = "\n".join(lines)
    client.log_text(cand_id, text + "\n", "compare.txt")
    client.log_text(cand_id, json.dumps(report, indent=1), "compare.json")
    client.set_tag(cand_id, "compare.baseline", base_id)
    return report, text
