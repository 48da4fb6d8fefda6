"""phasesweep's Hydra launcher, hydra/launcher=phasesweep_ray (schema: _config.py): keeps what
Hydra hands it and delegates to orchestrator.launcher.launch, imported only at launch (Hydra's
plugin scan imports this module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# importing the schema stores it in Hydra's ConfigStore (the plugin scan skips _config.py)
from hydra_plugins.phasesweep_launcher._config import PhaseSweepRayLauncherConf

__all__ = ["PhaseSweepRayLauncher", "PhaseSweepRayLauncherConf"]


class PhaseSweepRayLauncher(Launcher):
    def __init__(
        self,
        dry_run: bool = False,
        exclude: Sequence[Any] = (),
        include: Sequence[Any] = (),
        max_variants: int | None = None,
        pair: str | None = None,
    ) -> None:
        """Takes the fields of PhaseSweepRayLauncherConf and keeps each as an attribute: the
        orchestrator reads them (orchestrator/launcher.py)."""
        self.dry_run = dry_run
        self.exclude, self.include, self.max_variants = exclude, include, max_variants
        self.pair = pair
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator.launcher import launch  # not at import: Hydra's plugin scan imports this module

        return launch(self, job_overrides, initial_job_idx)
