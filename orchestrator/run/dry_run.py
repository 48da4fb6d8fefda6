"""The plan's printout: its first lines for every sweep, and the whole plan for a dry run."""

from __future__ import annotations

from orchestrator.common.console import say
from orchestrator.plan.capture import wants_capture
from orchestrator.plan.placement import capacity_text
from orchestrator.plan.planner import Plan
from orchestrator.read.summary import plan_text
from orchestrator.record.store import resolve_uri
from orchestrator.record.tracking import existing_runs


def say_plan(plan: Plan) -> None:
    """The plan's first lines: its counts, each skipped combination, what the rules left out."""
    excluded = f", {sum(len(e.jobs) for e in plan.excluded)} excluded" if plan.excluded else ""
    say(f"phasesweep: {len(plan.variants)} variant(s), {len(plan.exports)} export(s), {len(plan.skipped)} skipped{excluded}")
    for s in plan.skipped:
        say(f"  skipped   {s.name}: {s.reason}")
    if plan.excluded:
        by_rule: dict[str, int] = {}
        for e in plan.excluded:
            by_rule[e.rule] = by_rule.get(e.rule, 0) + len(e.jobs)
        for rule, n in by_rule.items():
            say(f"  excluded  {n} job(s): {rule}")
    for a, b in plan.pairs:
        say(f"  A/B pair  {b} against {a}: timed interleaved once both are measured")


def say_dry_run(plan: Plan) -> None:
    """The rest of a dry run's printout (say_plan gave its first lines): where it was planned,
    how many runs the tracking store already holds for each variant, the whole plan. Nothing
    runs, no store is created."""
    cluster = plan.point.cluster
    where = "this machine as a local Ray would offer it (not started)" if cluster.address is None else f"the Ray cluster at {cluster.address}"
    say(f"dry run: planned for {where}: {capacity_text(plan.capacity)}")
    standing = sum(1 for pv in plan.variants if wants_capture(pv.variant.phase))
    if standing:
        say(
            f"dry run: {standing} variant(s) read 'captured': each stands for the calls its phase.app makes, up to "
            "phase.capture.max_variants of each kind; a dry run does not run the application"
        )
    tracking = plan.point.tracking
    existing = existing_runs(tracking)
    if existing:
        keys = [pv.variant.bench_key for pv in plan.variants]
        held = sum(1 for k in keys if k in existing)
        ok = sum(1 for k in keys if "ok" in existing.get(k, ()))
        reuse = "reused (tracking.resume)" if tracking.resume else "measured again (tracking.resume=false)"
        say(f"dry run: {held} variant(s) have runs in {resolve_uri(tracking)} already; {ok} ended ok and would be {reuse}")
    else:
        say(f"dry run: no runs in {resolve_uri(tracking)} yet")
    say(plan_text(plan, existing, resume=tracking.resume))
