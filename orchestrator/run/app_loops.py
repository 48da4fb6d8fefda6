"""phase=captured, after its variants: the application runs again on each captured job's runtime
(tasks/app_loop.py), so its generation predicted from the benchmarks can be set beside what it
measured there (orchestrator/read/generation_app.py). One run per captured job (one backend
point) whose variants all ended ok, with its prompt's variant and its deepest decode's export."""

from __future__ import annotations

from typing import Any

from orchestrator.common.outcome import Outcome, Status
from orchestrator.plan.placement import Request
from orchestrator.plan.planner import Plan
from tasks.specs import AppLoopSpec


def ready(plan: Plan, name: str, outcomes: dict[str, Outcome]) -> list[tuple[str, AppLoopSpec, Request]]:
    """(key, spec, request) of each captured job of variant `name` whose variants have all ended
    ok; the key is the job's prompt variant (what the comparison files the result under)."""
    if not plan.captures:
        return []
    out = []
    for job in plan.variant(name).jobs:
        members = [pv for pv in plan.variants if job in pv.jobs]
        if not all(pv.variant.phase.kind for pv in members):  # a synthetic job: not an application's calls
            continue
        if not all(outcomes[pv.name].status == Status.OK for pv in members):
            continue
        prompts = [pv for pv in members if pv.variant.phase.context_len is None]
        steps = [pv for pv in members if pv.variant.phase.context_len is not None]
        if len(prompts) != 1 or not steps:
            continue
        prompt, deepest = prompts[0], max(steps, key=lambda pv: pv.variant.phase.context_len)
        capture, calls = _capture_of(plan, prompt.variant.phase.inputs)
        held = deepest.variant.phase.cache_len  # a fixed cache's slots; None: it grows
        if capture is None or (held is not None and held < prompt.variant.phase.prompt_len + calls - 1):
            continue  # the application would outgrow the export (compared with transformers instead, and said so)
        spec = AppLoopSpec(key=prompt.name, capture=capture, prefill=prompt.bench, decode=deepest.bench)
        out.append((prompt.name, spec, prompt.request))
    return out


def _capture_of(plan: Plan, inputs: str | None) -> tuple[Any, int]:
    """The capture whose kept calls include these recorded inputs, and its application's forward
    calls in one run (batch 1: its new tokens); (None, 0) if none."""
    for key, result in plan.captures.results.items():
        if inputs in {p.inputs for p in result.kept}:
            return plan.captures.specs[key], int(result.timings.get("app_calls", result.total_calls))
    return None, 0
