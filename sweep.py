"""phasesweep: export LLMs and benchmark them phase by phase.

    python sweep.py                                          # the defaults: one variant
    python sweep.py -m model=llama,phi3 phase=prefill,decode # a grid, on Ray, into MLflow

With -m, phasesweep's launcher (conf/hydra/launcher/) plans the whole grid at once; a
single run goes through the same orchestrator entry point as a sweep of one.
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from orchestrator.config import ConfigError


@hydra.main(version_base="1.3", config_path="conf", config_name="sweep")
def main(cfg: DictConfig) -> None:
    from orchestrator.run import run_sweep

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    try:
        outcomes = run_sweep([cfg], [overrides], Path(hc.runtime.output_dir), f"python sweep.py {' '.join(overrides)}")
    except ConfigError as e:
        sys.exit(f"phasesweep: {e}")
    failed = [o.name for o in outcomes.values() if o.status == "failed"]
    if failed:
        sys.exit(f"phasesweep: {len(failed)} variant(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
