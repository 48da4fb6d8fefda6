"""The class Hydra instantiates for hydra/launcher=phasesweep_ray (plugins must live here)."""

from orchestrator.launcher import PhaseSweepLauncherBase


class PhaseSweepRayLauncher(PhaseSweepLauncherBase):
    pass
