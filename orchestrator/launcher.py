"""What phasesweep's Hydra launcher does (hydra_plugins/phasesweep_launcher/ray_launcher.py is the
thin class Hydra instantiates): compose every job's config, hand the whole grid to the same
entry a single run uses, and return one JobReturn a job.

Only a planner that sees the whole grid can deduplicate exports, place work and resume, so
the jobs are not run one by one as Hydra's basic launcher does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict, read_write

from orchestrator.entry import run_or_exit


class LauncherState(Protocol):
    """What the plugin keeps for us: its config fields and what Hydra's setup() gave it."""

    config: DictConfig | None
    hydra_context: HydraContext | None
    dry_run: bool


def launch(launcher: LauncherState, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    setup_globals()
    config, hydra_context = launcher.config, launcher.hydra_context
    assert config is not None and hydra_context is not None, "setup() comes before launch()"
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    # The driver is the one job of a sweep: its log (hydra/job_logging) goes to the sweep dir.
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = str(sweep_dir)
    configure_log(config.hydra.job_logging, config.hydra.verbose)

    configs, overrides = [], []
    for offset, job in enumerate(job_overrides):
        cfg = hydra_context.config_loader.load_sweep_config(config, list(job))
        with open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + offset
        configs.append(cfg)
        overrides.append(list(filter_overrides(job)))
    command = " ".join(config.hydra.overrides.task) or "(defaults)"
    # Every variant is recorded and summarised before this returns or exits.
    outcomes = run_or_exit(configs, overrides, sweep_dir, f"python sweep.py -m {command}", dry_run=launcher.dry_run)

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
        outcome = outcomes.get(offset)  # none in a dry run: it plans and runs nothing
        ret.return_value = outcome.status if outcome is not None else None
        returns.append(ret)
    return returns
