"""What phasesweep's Hydra launcher does (ray_launcher.py is the thin class Hydra instantiates):
compose every job's config (plan/compose.py), hand the whole grid to the entry a single run
uses (a planner that sees the whole grid deduplicates exports, places work and resumes),
and return one JobReturn a job: its status and outcome, not its config (JobConfigs[i] composes
it when asked; composing every job's to hand back would cost seconds at 10,000 jobs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from orchestrator.entry import run_or_exit
from orchestrator.plan.compose import JobConfigs
from orchestrator.run.fork_hosts import ForkServers

GROUPS = ("model", "phase", "backend", "device")  # what a grid rule's group key may name


class LauncherState(Protocol):
    """What the plugin keeps for us: its config fields and what Hydra's setup() gave it."""

    config: DictConfig | None
    hydra_context: HydraContext | None
    dry_run: bool
    exclude: Any
    include: Any
    max_variants: int | None
    pair: str | None


def grid_settings(launcher: Any, loader: Any) -> dict[str, Any]:
    """The launcher's grid control (hydra.launcher.include/exclude/max_variants) as plain
    values, with the options of each group a rule may name (orchestrator.plan.grid.grid_rules
    checks them)."""

    def plain(value: Any) -> Any:
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    groups = {}
    for group in GROUPS:
        try:
            groups[group] = list(loader.get_group_options(group))
        except Exception:  # a loader that cannot tell: any name is accepted
            continue
    return {
        "include": plain(getattr(launcher, "include", None)) or [],
        "exclude": plain(getattr(launcher, "exclude", None)) or [],
        "max_variants": getattr(launcher, "max_variants", None),
        "pair": getattr(launcher, "pair", None),
        "groups": groups,
    }


def warm_forks(config: DictConfig, dry_run: bool) -> ForkServers | None:
    """A local sweep's export server, begun before its jobs are composed (ForkServers.warm): it
    imports torch and transformers while the driver composes, validates and plans. None for a dry
    run, a cluster to join or cluster.fork_server=false, as the sweep's own config reads (the
    cluster group is one for the whole sweep; a bad value is validation's to refuse, and the
    server ends unused)."""
    if dry_run or OmegaConf.select(config, "cluster.address", default=None, throw_on_resolution_failure=False) is not None:
        return None
    if OmegaConf.select(config, "cluster.fork_server", default=True, throw_on_resolution_failure=False) is not True:
        return None
    forks = ForkServers()
    forks.warm()
    return forks


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

    forks = warm_forks(config, launcher.dry_run)
    try:
        loader = hydra_context.config_loader
        configs = JobConfigs(loader, config, job_overrides, initial_job_idx)
        overrides = [list(filter_overrides(job)) for job in job_overrides]
        command = " ".join(config.hydra.overrides.task) or "(defaults)"
        # Every variant is recorded and summarised before this returns or exits.
        outcomes = run_or_exit(
            configs,
            overrides,
            sweep_dir,
            f"python sweep.py -m {command}",
            dry_run=launcher.dry_run,
            grid=grid_settings(launcher, loader),
            forks=forks,
        )
    finally:
        if forks is not None:  # ended with the run's scheduler; here when a bad config stopped it first
            forks.stop()

    returns = []
    task_name, working_dir = str(config.hydra.job.name), str(sweep_dir)  # read once, not per job
    for offset, job in enumerate(job_overrides):
        ret = JobReturn(  # cfg and hydra_cfg left None: Hydra reads neither from a launcher's returns
            overrides=list(job), working_dir=working_dir, task_name=task_name, status=JobStatus.COMPLETED
        )
        outcome = outcomes.get(offset)  # none in a dry run (it runs nothing), nor for an excluded point
        ret.return_value = outcome.status if outcome is not None else None
        returns.append(ret)
    return returns
