"""The variants a point measures, made from the planner's variant of it: one per call its
captured application kept (orchestrator/plan/capture.py), normalised for the point's cache and
checked against its model's dimensions; one per depth of decode's phase.depths where the
backend's export or runtime fixes the depth (the contract's fixed_depth, tasks/contract.py),
each at context_len=depth and named by it (decode's NAMING_KEYS); else the variant itself,
which then measures every depth from one export (tasks/depth_series.py)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.plan.config import SweepPoint
from orchestrator.plan.variant import Variant
from tasks.contract import Point
from tasks.specs import PhaseSpec


def fixed_depth(point: SweepPoint) -> str | None:
    """Why this point's backend measures one depth per export, or None."""
    b = point.backend
    asked = Point(b.name, point.device.name, point.model, point.phase, b.export_options, b.options, point.arch)
    return b.runtime_part.fixed_depth(asked) or b.format_part.fixed_depth(asked)


def shapes(point: SweepPoint, v: Variant, kept: tuple[PhaseSpec, ...] | None) -> list[Variant]:
    """The point's variants: one per call in `kept` (its capture's; None for a point that
    captures nothing), one per depth where fixed_depth(point) says so, or [v]. A kept call
    that does not fit the model raises ConfigError, before any run exists."""
    if kept is None and (not v.phase.depths or fixed_depth(point) is None):
        return [v]
    module = point.phase_part
    if kept is None:
        at = [replace(v.phase, context_len=d, depths=None, cache_len=None) for d in v.phase.depths or ()]
        return [replace(v, phase=module.normalize(phase, v.model.kv_cache)) for phase in at]
    variants = []
    for phase in kept:
        phase = module.normalize(phase, v.model.kv_cache)
        module.check(phase, point.dims)
        variants.append(replace(v, phase=phase))
    return variants
