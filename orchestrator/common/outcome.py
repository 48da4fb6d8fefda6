"""Where each variant stands: its status values (defined once here) and what the sweep
learned of it so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Status(StrEnum):
    """A variant's status, as shown in the table and the MLflow tag `status`."""

    PLANNED = "planned"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    ABORTED = "aborted"  # the sweep stopped (Ctrl-C, a driver error) before the variant ended


ENDED = (Status.OK, Status.FAILED, Status.SKIPPED, Status.ABORTED)


@dataclass
class Outcome:
    """Where one variant stands, and what the summary shows of it."""

    name: str
    status: Status = Status.PLANNED
    run_id: str | None = None
    axes: dict[str, str] = field(default_factory=dict)  # model, phase, backend, device
    shapes: dict[str, list[int]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # metric -> (step, value): decode's depths
    stage: str | None = None
    error: str | None = None
    unstable: bool = False
    reused_from: str | None = None  # the earlier sweep's run this variant's result comes from
    retries: list[str] = field(default_factory=list)  # why each retry happened
    alert: str | None = None  # tracking.baseline: why it is worse than its baseline (orchestrator/read/alert.py)

    @property
    def ended(self) -> bool:
        return self.status in ENDED
