"""The launcher's and sweeper's schemas in Hydra's ConfigStore (hydra/launcher=phasesweep_ray,
hydra/sweeper=phasesweep); imported by both plugin modules (the plugin scan skips _*)."""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class PhaseSweepRayLauncherConf:
    """hydra.launcher: how the grid is planned. The launcher keeps each field as an attribute;
    the orchestrator reads them there (orchestrator/launcher.py).

    - `dry_run`: print the plan (variants, resources, exports, skipped and excluded points,
      runs that already exist) and run nothing;
    - `exclude` / `include`: rules over the grid's points, e.g.
      `exclude: [{backend: executorch, device: cuda}]` (orchestrator/plan/grid.py says how they read);
    - `max_variants`: at most this many variants per model (the first, in grid order); null: all;
    - `pair`: a key whose two values in the grid make A/B pairs of variants equal in all else,
      each pair also timed interleaved (baseline: the value given first), e.g. `model.kv_cache`.
    """

    _target_: str = "hydra_plugins.phasesweep_launcher.ray_launcher.PhaseSweepRayLauncher"
    dry_run: bool = False
    exclude: list[dict[str, Any]] = field(default_factory=list)
    include: list[dict[str, Any]] = field(default_factory=list)
    max_variants: int | None = None
    pair: str | None = None


@dataclass
class PhaseSweepSweeperConf:
    """hydra.sweeper: the grid as Hydra's basic sweeper makes it, jobs not composed before launch."""

    _target_: str = "hydra_plugins.phasesweep_launcher.sweeper.PhaseSweepSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


ConfigStore.instance().store(
    group="hydra/launcher", name="phasesweep_ray", node=PhaseSweepRayLauncherConf, provider="phasesweep"
)
ConfigStore.instance().store(
    group="hydra/sweeper", name="phasesweep", node=PhaseSweepSweeperConf, provider="phasesweep"
)
