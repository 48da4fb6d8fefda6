"""What a backend can run: the point's device among the yaml's `devices`, then the contract's
`refuses()` (tasks/contract.py), asked of the runtime and then of the export format."""

from __future__ import annotations

from typing import Any

from orchestrator.plan.config import SweepPoint
from tasks.contract import Point


def unsupported(point: SweepPoint) -> str | None:
    """Why this backend cannot run this point at all (a skip, never a failure), or None."""
    b, device = point.backend, point.device.name
    if device not in b.devices:
        return f"backend {b.name} does not run on device={device} (backend.devices: {', '.join(b.devices)})"
    asked = Point(b.name, device, point.model, point.phase, b.export_options, b.options, point.arch)
    return b.runtime_part.refuses(asked) or b.format_part.refuses(asked)


SCALARS = (str, int, float, bool, type(None))


def value_key(obj: Any) -> tuple[Any, ...]:
    """A config dataclass's field values, hashable: dicts, lists and nested dataclasses by their
    repr (equal values in another order only cost one more answer)."""
    return tuple(v if isinstance(v, SCALARS) else repr(v) for v in vars(obj).values())


class Support:
    """unsupported(), asked once per distinct (backend, device, model, phase) of a plan."""

    def __init__(self) -> None:
        self.reasons: dict[tuple[Any, ...], str | None] = {}

    def __call__(self, point: SweepPoint) -> str | None:
        key = (value_key(point.backend), point.device.name, value_key(point.model), value_key(point.phase))
        if key not in self.reasons:
            self.reasons[key] = unsupported(point)
        return self.reasons[key]
