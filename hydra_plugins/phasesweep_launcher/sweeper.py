"""phasesweep's Hydra sweeper, hydra/sweeper=phasesweep (its schema: _config.py).

Hydra's basic sweeper, less one step: before handing a batch to the launcher it composes
every job once to find composition errors early, then the launcher composes each again.
At 0.1-0.2 s a job that doubles the time before a 10,000-job grid is planned. phasesweep's
launcher composes the whole batch before anything runs (once per combination of group
choices: orchestrator/plan/compose.py), so Hydra's errors still come before any work.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

# importing the schema stores it in Hydra's ConfigStore (the plugin scan skips _config.py)
from hydra_plugins.phasesweep_launcher._config import PhaseSweepSweeperConf

__all__ = ["PhaseSweepSweeper", "PhaseSweepSweeperConf"]


class PhaseSweepSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Left to the launcher, which composes the batch before anything runs."""
