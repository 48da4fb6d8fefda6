"""decode's phase.depths where a backend's export or runtime fixes the depth (the contract's
fixed_depth, tasks/contract.py): one variant, and so one export, per depth, each at
context_len=depth, named by it (decode's NAMING_KEYS). Elsewhere one variant measures every
depth from one export (tasks/depth_series.py)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.plan.config import SweepPoint
from orchestrator.plan.variant import Variant
from tasks.contract import Point
from tasks.phases import phase_module


def fixed_depth(point: SweepPoint) -> str | None:
    """Why this point's backend measures one depth per export, or None."""
    b = point.backend
    asked = Point(b.name, point.device.name, point.model, point.phase, b.export_options, b.options, point.arch)
    return b.runtime_part.fixed_depth(asked) or b.format_part.fixed_depth(asked)


def per_depth(point: SweepPoint, v: Variant) -> list[Variant]:
    """[v], or one variant per depth of v.phase.depths where fixed_depth(point) says so."""
    if not v.phase.depths or fixed_depth(point) is None:
        return [v]
    module = phase_module(v.phase.name)
    return [
        replace(v, phase=module.normalize(replace(v.phase, context_len=d, depths=None, cache_len=None), v.model.kv_cache))
        for d in v.phase.depths
    ]
