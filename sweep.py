"""phasesweep: export LLMs and benchmark them phase by phase.

    python sweep.py                                          # the defaults: one variant
    python sweep.py -m model=llama,phi3 phase=prefill,decode # a grid, on Ray, into MLflow

With -m, phasesweep's launcher (hydra_plugins/phasesweep_launcher/) plans the whole grid at
once; a single run goes through the same orchestrator entry point and exit path as a sweep.
"""

import faulthandler
import signal
import sys
from pathlib import Path

from tasks.worker.heap import ending, manage_process

manage_process()  # the driver's process is phasesweep's own: before the imports below register exit handlers
try:  # `kill -USR1 PID`: every thread's stack on stderr, the sweep going on
    faulthandler.register(signal.SIGUSR1, all_threads=True)
except (AttributeError, OSError):  # a stderr that is no file (sweep.py run inside pytest's capture, a notebook)
    pass


def main() -> None:
    """Hydra's app, run inside the exit path below."""
    # lazy: inside that exit path, a Ctrl-C while Hydra loads is one line, not a traceback
    import hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    @hydra.main(version_base="1.3", config_path="conf", config_name="sweep")
    def app(cfg: DictConfig) -> None:
        from orchestrator.entry import run_or_exit  # the driver's modules load for a run, not for --help
        from orchestrator.launcher import grid_settings

        hc = HydraConfig.get()
        overrides = list(hc.overrides.task)
        command = f"python sweep.py {' '.join(overrides)}"
        grid = grid_settings(hc.launcher, GlobalHydra.instance().config_loader())  # hydra.launcher.exclude/include/...
        run_or_exit(
            [cfg], [overrides], Path(hc.runtime.output_dir), command, dry_run=bool(hc.launcher.get("dry_run")), grid=grid
        )

    app()


if __name__ == "__main__":
    try:
        from orchestrator.help import fast_help

        text = fast_help(sys.argv[1:], Path(__file__).resolve().parent / "conf", "sweep", Path(__file__).stem)
        if text is None:
            main()
        else:
            print(text)
    except SystemExit as e:  # Hydra's and ours: the status, its message printed as Python prints it
        ending(e.code)
        raise
    except KeyboardInterrupt:  # before the run's own handling (orchestrator/entry.py), or after it ended
        print("phasesweep: interrupted (SIGINT); no run was open", file=sys.stderr)
        ending(130)
        sys.exit(130)
    ending(0)
