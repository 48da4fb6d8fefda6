"""A/B pairs within one sweep (`hydra.launcher.pair=KEY`): two variants equal in everything but
KEY, whose grid holds two values; the value given first is the baseline. Each pair is also
timed interleaved (tasks/paired.py), so its ratio holds whatever the machine did between
the two benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.plan.grid import GROUP_KEYS
from tasks.specs import ConfigError


def _rest(v: Any, key: str) -> tuple:
    """What must be equal within a pair: the job's other overrides (a value the pair key
    implies, such as a static cache's capacity, may differ) and the phase's shape."""
    others = tuple(
        o for o in v.overrides if (k := o.split("=", 1)[0].lstrip("+~")) != key and GROUP_KEYS.get(k) != key
    )
    p = v.phase
    return others, p.name, p.batch, p.prompt_len, p.context_len


def pair_variants(planned: Sequence[Any], key: str) -> tuple[tuple[str, str], ...]:
    """(baseline name, candidate name) of each pair among `planned` (PlannedVariants, in grid
    order), or a ConfigError naming the key when it makes no pair or more than two values."""
    order: list[Any] = []  # KEY's values in the order the grid gives them
    groups: dict[tuple, list[Any]] = {}
    for pv in planned:
        value = pv.variant.params.get(key)
        if value not in order:
            order.append(value)
        groups.setdefault(_rest(pv.variant, key), []).append(pv)
    if len(order) != 2:
        shown = ", ".join(map(str, order))
        raise ConfigError(
            f"hydra.launcher.pair={key}: an A/B pair needs exactly two values of {key} in the grid, "
            f"it has {len(order)} ({shown}); sweep it as {key}=A,B"
        )
    pairs = []
    for members in groups.values():
        if len(members) == 2:
            a, b = sorted(members, key=lambda pv: order.index(pv.variant.params.get(key)))
            pairs.append((a.name, b.name))
    if not pairs:
        raise ConfigError(f"hydra.launcher.pair={key}: no two variants differ in {key} alone (the others were skipped or excluded)")
    return tuple(pairs)
