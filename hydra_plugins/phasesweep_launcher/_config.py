"""The launcher's config schema, stored in Hydra's ConfigStore as hydra/launcher=phasesweep_ray.

Hydra's plugin scan skips modules named _*; ray_launcher.py imports this one, which stores
the schema. It imports nothing but Hydra.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class PhaseSweepRayLauncherConf:
    """hydra.launcher: `dry_run` plans the grid without running it. The launcher keeps it as
    `self.dry_run`; the orchestrator reads it there and passes it to orchestrator.run.run_sweep."""

    _target_: str = "hydra_plugins.phasesweep_launcher.ray_launcher.PhaseSweepRayLauncher"
    dry_run: bool = False


ConfigStore.instance().store(
    group="hydra/launcher", name="phasesweep_ray", node=PhaseSweepRayLauncherConf, provider="phasesweep"
)
