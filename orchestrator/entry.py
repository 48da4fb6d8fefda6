"""The one exit path of the driver, for a single run (sweep.py) and a sweep (the launcher): one
line, never Hydra's traceback; status 1 when a variant failed, 3 when a variant alerted against
tracking.baseline (slower, parity broken or lost quality: docs/regressions.md), 130 on Ctrl-C,
143 on SIGTERM."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from orchestrator.common.outcome import Outcome, Status
from orchestrator.common.signals import Terminated, installed
from orchestrator.plan.config import ConfigError
from orchestrator.record.journal import ServerGone

if TYPE_CHECKING:
    from orchestrator.run.fork_hosts import ForkServers

ALERT_EXIT = 3  # a variant worse than its baseline (tracking.baseline): CI fails on it


def run_or_exit(
    configs: Sequence[DictConfig],
    overrides: list[list[str]],
    out_dir: Path,
    command: str,
    dry_run: bool = False,
    grid: dict[str, Any] | None = None,
    forks: ForkServers | None = None,
) -> dict[int, Outcome]:
    """orchestrator.run.sweep.run_sweep, or SystemExit: 'phasesweep: <what is wrong>' for a bad config
    (or grid rule), 'phasesweep: N variant(s) failed: a, b' (status 1) when any variant failed,
    'phasesweep: ALERT: ...' (status ALERT_EXIT) when any variant alerted against tracking.baseline.
    `grid`: the launcher's grid control (orchestrator.launcher.grid_settings); `forks`: its fork
    servers begun early (orchestrator.launcher.warm_forks)."""
    # MLflow sets up its own loggers when imported (INFO to stderr); the driver shows their warnings only
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from orchestrator.run.sweep import run_sweep  # the driver loads when a run starts: sweep.py --help stays fast

    try:
        with installed():  # Ctrl-C and SIGTERM wait for a write to the store in flight (orchestrator.common.signals)
            outcomes = run_sweep(configs, overrides, out_dir, command, dry_run=dry_run, grid=grid, forks=forks)
    except (ConfigError, ServerGone) as e:
        sys.exit(f"phasesweep: {e}")
    except KeyboardInterrupt:  # every open run is closed KILLED by now, Ray is shut down
        print("phasesweep: interrupted (SIGINT); open runs closed as KILLED, finished ones kept", file=sys.stderr)
        sys.exit(130)
    except Terminated:
        print("phasesweep: terminated (SIGTERM); open runs closed as KILLED, finished ones kept", file=sys.stderr)
        sys.exit(143)
    failed = sorted({o.name for o in outcomes.values() if o.status == Status.FAILED})
    alerted = sorted({o.name for o in outcomes.values() if o.alert})
    if alerted:
        also = f"; {len(failed)} failed: {', '.join(failed)}" if failed else ""
        print(f"phasesweep: ALERT: {len(alerted)} variant(s) worse than tracking.baseline: {', '.join(alerted)}{also}", file=sys.stderr)
        sys.exit(ALERT_EXIT)
    if failed:
        sys.exit(f"phasesweep: {len(failed)} variant(s) failed: {', '.join(failed)}")
    return outcomes
