"""Hydra Launcher: receives every job's overrides, composes them all, hands the whole grid
to orchestrator.run (the same entry a single run uses), and returns one JobReturn a job.

Hydra only instantiates launchers defined under the `hydra_plugins` package, so the class
Hydra sees is a thin subclass in hydra_plugins/phasesweep_launcher/ray_launcher.py.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


class PhaseSweepLauncherBase(Launcher):
    def __init__(self, **_: object) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator.config import ConfigError
        from orchestrator.run import run_sweep  # after Hydra's plugin scan, not during

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)

        configs, overrides = [], []
        for offset, job in enumerate(job_overrides):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + offset
            configs.append(cfg)
            overrides.append(list(filter_overrides(job)))
        command = " ".join(self.config.hydra.overrides.task) or "(defaults)"
        try:
            outcomes = run_sweep(configs, overrides, sweep_dir, f"python sweep.py -m {command}")
        except ConfigError as e:
            sys.exit(f"phasesweep: {e}")

        # Every variant is recorded and summarised by now. Failed variants end the process
        # with status 1 and one clear line, rather than Hydra's traceback of the first one.
        failed = sorted({o.name for o in outcomes.values() if o.status == "failed"})
        if failed:
            sys.exit(f"phasesweep: {len(failed)} variant(s) failed: {', '.join(failed)}")
        returns = []
        for offset, (job, cfg) in enumerate(zip(job_overrides, configs, strict=True)):
            ret = JobReturn(
                overrides=list(job),
                cfg=cfg,
                hydra_cfg=cfg,
                working_dir=str(sweep_dir),
                task_name=str(cfg.hydra.job.name),
                status=JobStatus.COMPLETED,
            )
            ret.return_value = outcomes[offset].status
            returns.append(ret)
        return returns
