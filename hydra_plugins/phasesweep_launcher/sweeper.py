"""phasesweep's Hydra sweeper, hydra/sweeper=phasesweep (schema: _config.py), on Hydra's public
Sweeper interface: the grid is the product of the swept values, as Hydra's basic sweeper makes
it, but jobs are not composed one by one before launch (the launcher composes the batch at once).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

# importing the schema stores it in Hydra's ConfigStore (the plugin scan skips _config.py)
from hydra_plugins.phasesweep_launcher._config import PhaseSweepSweeperConf

__all__ = ["PhaseSweepSweeper", "PhaseSweepSweeperConf"]


def grid(overrides: list[Any]) -> list[list[str]]:
    """Each job's overrides: the product of the swept values, a key given twice counted once (the last)."""
    axes: dict[str, list[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            axes[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            axes[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise HydraException(f"PhaseSweepSweeper does not support sweep type : {o.value_type.name}")
    return [list(job) for job in itertools.product(*axes.values())]


class PhaseSweepSweeper(Sweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        self.max_batch_size, self.params = max_batch_size, params or {}
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.hydra_context is not None, "setup() comes before sweep()"
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = grid(parser.parse_overrides([*(f"{k}={v}" for k, v in self.params.items()), *arguments]))
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        size = self.max_batch_size if self.max_batch_size not in (None, -1) else len(jobs)
        returns = []
        for start in range(0, len(jobs), size):
            results = self.launcher.launch(jobs[start : start + size], initial_job_idx=start)
            for r in results:
                _ = r.return_value  # raises a failed job's exception, as Hydra's basic sweeper does
            returns.append(results)
        return returns

    def validate_batch_is_legal(self, batch: Any) -> None:
        """Left to the launcher, which composes the whole batch before anything runs."""
