"""A sweep held against its baseline (`tracking.baseline`): each variant it measured, judged
against the same variant on the same machine in `last:N` earlier sweeps of the experiment, or
in one named sweep run, by compare's rules (orchestrator/read/history.py `judge`: the ratio's
interval against min_effect, Holm-corrected, the machine-speed probe's disturbance rule).

A variant alerts when it is
- slower than more than half of its baselines (a single baseline: slower than it);
- parity broken: it failed its parity check where its baseline passed;
- lost quality (orchestrator/read/quality_compare.py) against more than half of its baselines.
An identical re-run does not alert: the verdict calls `slower` only for an interval wholly
beyond 1 + min_effect with a significant p, and beyond the machine's own speed change."""

from __future__ import annotations

import os
from collections import defaultdict
from statistics import median
from typing import Any

from orchestrator.common.console import table
from orchestrator.plan.config import ConfigError, TrackingCfg
from orchestrator.read.history import judge, machine_of
from orchestrator.read.quality_compare import quality_changes
from orchestrator.read.store import SWEEP_FILTER, variant_runs
from orchestrator.record.tracking import search_all

PARITY = "parity broken"


def named_sweep(client: Any, experiment_id: str, ref: str) -> Any:
    """The sweep run `tracking.baseline` names, by run name (sweep_2026-...) or run id, in this
    experiment; a ConfigError naming the key when there is none."""
    from mlflow.exceptions import MlflowException  # lazy: mlflow, only once a store is opened

    found = search_all(client, experiment_id, f"{SWEEP_FILTER} and attributes.run_name = '{ref}'") if "'" not in ref else []
    if found:
        return max(found, key=lambda r: r.info.start_time)
    try:
        run = client.get_run(ref)
    except MlflowException:
        run = None
    if run is None or run.data.tags.get("phasesweep.role") != "sweep" or run.info.experiment_id != experiment_id:
        raise ConfigError(
            f"tracking.baseline={ref!r}: no sweep run of that name or id in this experiment; give last:N or a sweep "
            "run's name or id (python -m orchestrator.report --history lists them)"
        )
    return run


def candidates(client: Any, parent: Any) -> dict[str, Any]:
    """{variant: run} the sweep measured itself (not reused) that ended ok or failed its parity check."""
    return {
        name: run
        for name, run, reused in variant_runs(client, parent)
        if reused is None and (run.data.tags.get("status") == "ok" or run.data.tags.get("failure_stage") == "parity")
    }


def baselines(client: Any, parent: Any, cands: dict[str, Any], cfg: TrackingCfg) -> dict[str, list[tuple[Any, Any]]]:
    """{variant: [(baseline sweep, its run of the variant)]}: ok runs on the same machine,
    measured by that sweep, from the named sweep or the last N sweeps before this one."""
    last = cfg.baseline_last()
    if last is None:
        sweeps = [named_sweep(client, parent.info.experiment_id, str(cfg.baseline))]
    else:
        earlier = search_all(client, parent.info.experiment_id, SWEEP_FILTER)
        sweeps = sorted((s for s in earlier if s.info.start_time < parent.info.start_time), key=lambda s: -s.info.start_time)
    limit = last or 1
    found: dict[str, list[tuple[Any, Any]]] = {name: [] for name in cands}
    machines = {name: machine_of(run) for name, run in cands.items()}
    for sweep in sweeps:
        if all(len(v) >= limit for v in found.values()):
            break
        for name, run, reused in variant_runs(client, sweep):
            if name in found and len(found[name]) < limit and reused is None and run.data.tags.get("status") == "ok" \
                    and machine_of(run) == machines[name]:  # fmt: skip
                found[name].append((sweep, run))
    return found


def hold(client: Any, parent_id: str, cfg: TrackingCfg) -> list[dict[str, str]]:
    """Each variant the sweep `parent_id` measured, judged against its baselines: one row each
    (variant, baseline, ratio, verdict, alert: empty unless it alerts)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # else a bar per baseline's samples
    parent = client.get_run(parent_id)
    cands = candidates(client, parent)
    found = baselines(client, parent, cands, cfg)
    by_sweep: dict[str, dict[str, Any]] = defaultdict(dict)  # baseline sweep id -> {variant: its run}
    for name, pairs in found.items():
        for sweep, run in pairs:
            by_sweep[sweep.info.run_id][name] = run
    verdicts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    lost: dict[str, list[bool]] = defaultdict(list)
    for base_runs in by_sweep.values():
        ok = {n: cands[n] for n in base_runs if cands[n].data.tags.get("status") == "ok"}
        for name, row in judge(client, {n: base_runs[n] for n in ok}, ok, cfg.min_effect, 0.05, 2000).items():
            verdicts[name].append(row)
        for name, change in quality_changes(base_runs, ok).items():
            lost[name].append(change["lost"])
    return [row_of(name, cands[name], found[name], verdicts[name], lost[name]) for name in sorted(cands)]


def row_of(name: str, run: Any, found: list[tuple[Any, Any]], verdicts: list[dict[str, Any]], lost: list[bool]) -> dict[str, str]:
    """One variant's row: its verdicts against each baseline, summed up, and its alert."""
    row = {"variant": name, "baseline": ", ".join(s.info.run_name for s, _ in found) or "none on this machine"}
    if not found:
        return row | {"ratio": "-", "verdict": "no baseline", "alert": ""}
    if run.data.tags.get("status") != "ok":
        return row | {"ratio": "-", "verdict": "parity failed", "alert": f"{PARITY} (ok in {found[0][0].info.run_name})"}
    if not verdicts:
        return row | {"ratio": "-", "verdict": "no latency samples", "alert": ""}
    ratio = median(v["ratio"] for v in verdicts)
    calls = [v["verdict"] for v in verdicts]
    slower = sum(c == "slower" for c in calls)
    why = []
    if slower * 2 > len(calls):
        why.append(f"slower {ratio:.2f}x (against {slower} of {len(calls)} baseline sweeps)")
    if lost and sum(lost) * 2 > len(lost):
        why.append(f"lost quality (against {sum(lost)} of {len(lost)})")
    low, high = (median(v[k] for v in verdicts) for k in ("ratio_ci_low", "ratio_ci_high"))
    text = ", ".join(f"{c} {calls.count(c)}" for c in dict.fromkeys(calls))
    return row | {"ratio": f"{ratio:.3f} [{low:.3f}, {high:.3f}]", "verdict": text, "alert": "; ".join(why)}


def alert_lines(cfg: TrackingCfg, rows: list[dict[str, str]]) -> list[str]:
    """The summary's lines: what the sweep was held against, and each variant's verdict."""
    alerts = [r for r in rows if r["alert"]]
    head = (
        f"held against tracking.baseline={cfg.baseline} (same variant, same machine; ratio = this sweep / baseline "
        f"median, min effect {cfg.min_effect:.0%}): "
        + (f"{len(alerts)} ALERT(S): {', '.join(r['variant'] for r in alerts)}" if alerts else "no alert")
    )
    shown = [r | {"alert": r["alert"] and "ALERT " + r["alert"]} for r in rows]
    return [head, table(shown)] if rows else [head]
