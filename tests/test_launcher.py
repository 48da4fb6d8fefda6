"""The Hydra launcher plugin (discovery, its config in the ConfigStore), the one exit path a
single run and a sweep share, and the driver's logging; run_sweep is faked: no Ray, no sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.utils import instantiate
from omegaconf import OmegaConf

from orchestrator.common.console import say
from orchestrator.common.outcome import Outcome, Status
from orchestrator.entry import run_or_exit
from orchestrator.plan.config import ConfigError
from tests.conftest import CONF, ROOT
from tests.test_forks import gone


@pytest.fixture
def hydra_cfg():
    """`hydra_cfg(*overrides)`: conf/sweep.yaml composed with its hydra node."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *overrides: compose("sweep", overrides=list(overrides), return_hydra_config=True)
    GlobalHydra.instance().clear()


def servers_of(forks) -> list[int]:
    """The pids of the fork servers `forks` began: this process's children serving its folder."""
    found = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", f"tasks.worker.forks {forks.base}"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


@pytest.fixture
def fake_run_sweep(monkeypatch):
    """Replaces orchestrator.run.sweep.run_sweep: `fake.returns` (or `fake.raises`) is what it does;
    `fake.calls` what it was given. It says one line, as the real one does."""
    import orchestrator.run.sweep

    class Fake:
        def __init__(self) -> None:
            self.calls: list[dict] = []
            self.returns: dict[int, Outcome] | None = None
            self.raises: Exception | None = None

        def __call__(self, configs, overrides, out_dir, command, dry_run=False, grid=None, forks=None):
            self.calls.append(
                dict(configs=configs, overrides=overrides, out_dir=out_dir, command=command, dry_run=dry_run, grid=grid, forks=forks)
            )
            if forks is not None:  # the servers begun for it
                self.calls[-1].update(servers=servers_of(forks), folder=forks.base)
            say(f"phasesweep: fake sweep of {len(configs)} config(s)")
            if self.raises is not None:
                raise self.raises
            if self.returns is not None:
                return self.returns
            return {i: Outcome(f"v{i}", Status.OK) for i in range(len(configs))}

    fake = Fake()
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")  # run_or_exit sets it; restored after
    monkeypatch.setattr(orchestrator.run.sweep, "run_sweep", fake)
    return fake


def test_plugin_is_discovered():
    names = [f"{p.__module__}.{p.__name__}" for p in Plugins.instance().discover(Launcher)]
    assert "hydra_plugins.phasesweep_launcher.ray_launcher.PhaseSweepRayLauncher" in names


def test_launcher_config_is_in_the_config_store(hydra_cfg):
    launcher = hydra_cfg().hydra.launcher
    assert launcher._target_.endswith("PhaseSweepRayLauncher")
    assert launcher.dry_run is False
    assert hydra_cfg("hydra.launcher.dry_run=true").hydra.launcher.dry_run is True
    assert instantiate(hydra_cfg("hydra.launcher.dry_run=true").hydra.launcher).dry_run is True
    # grid control (orchestrator/plan/grid.py): nothing left out by default
    assert launcher.exclude == [] and launcher.include == [] and launcher.max_variants is None
    ours = instantiate(
        hydra_cfg("hydra.launcher.max_variants=3", "hydra.launcher.exclude=[{device: cuda}]").hydra.launcher
    )
    assert ours.max_variants == 3 and list(ours.exclude) == [{"device": "cuda"}]


def test_sweeper_is_ours_and_leaves_composing_to_the_launcher(hydra_cfg):
    """Hydra's basic sweeper composes every job before the launcher does; ours does not."""
    from hydra_plugins.phasesweep_launcher.sweeper import PhaseSweepSweeper

    assert hydra_cfg().hydra.sweeper._target_.endswith("sweeper.PhaseSweepSweeper")
    names = [f"{p.__module__}.{p.__name__}" for p in Plugins.instance().discover(Sweeper)]
    assert "hydra_plugins.phasesweep_launcher.sweeper.PhaseSweepSweeper" in names
    assert PhaseSweepSweeper(max_batch_size=None).validate_batch_is_legal([["model=nope"]]) is None


@pytest.mark.parametrize(
    "args, params",
    [
        (["model=llama,phi3", "phase=prefill,decode", "bench.repeats=range(1,4)", "device=cpu"], {}),
        (["model=phi3", "phase.batch=1,2", "model=llama,phi3"], {"backend": "eager,onnxruntime", "model": "llama"}),
        ([], {}),
    ],
)
def test_the_sweepers_grid_is_hydras_basic_sweepers(args, params):
    """The same jobs, in the same order, as hydra/sweeper=basic (found through Hydra's ConfigStore)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.utils import get_class

    from hydra_plugins.phasesweep_launcher.sweeper import grid

    basic = get_class(ConfigStore.instance().load("hydra/sweeper/basic.yaml").node._target_)
    parsed = OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *args])
    assert grid(parsed) == basic.split_arguments(parsed, None)[0]


def test_job_logging_is_ours(hydra_cfg):
    logs = OmegaConf.to_container(hydra_cfg().hydra.job_logging)  # not resolved: no run dir yet
    assert logs["root"]["level"] == "WARNING"
    assert logs["loggers"]["phasesweep"]["level"] == "INFO"
    console, file = logs["handlers"]["console"], logs["handlers"]["file"]
    assert logs["formatters"][console["formatter"]]["format"] == "%(message)s"
    assert console["stream"] == "ext://sys.stdout"
    assert file["filename"] == "${hydra.runtime.output_dir}/${hydra.job.name}.log"


def test_plugin_modules_import_light():
    """Hydra's plugin scan imports every module under hydra_plugins: none may pull in the driver."""
    code = (
        "import sys; from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher;"
        "Plugins.instance().discover(Launcher);"
        "import hydra_plugins.phasesweep_launcher._config;"
        "heavy = [m for m in ('torch', 'ray', 'mlflow', 'orchestrator.run.sweep', 'orchestrator.launcher') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_exit_on_config_error(fake_run_sweep, tmp_path):
    fake_run_sweep.raises = ConfigError("model.kv_cache='paged' is not allowed; choose one of: static, dynamic")
    with pytest.raises(SystemExit) as exit_:
        run_or_exit([], [], tmp_path, "python sweep.py")
    assert exit_.value.code == "phasesweep: model.kv_cache='paged' is not allowed; choose one of: static, dynamic"


def test_exit_names_the_failed_variants_once(fake_run_sweep, tmp_path):
    b = Outcome("b_decode", Status.FAILED)  # two jobs planned as one variant share its outcome
    fake_run_sweep.returns = {0: b, 1: Outcome("c", Status.OK), 2: Outcome("a_prefill", Status.FAILED), 3: b}
    with pytest.raises(SystemExit) as exit_:
        run_or_exit([], [], tmp_path, "python sweep.py")
    assert exit_.value.code == "phasesweep: 2 variant(s) failed: a_prefill, b_decode"


def test_no_exit_when_nothing_failed(fake_run_sweep, tmp_path):
    fake_run_sweep.returns = {0: Outcome("a", Status.OK), 1: Outcome("b", Status.SKIPPED)}
    assert run_or_exit([], [], tmp_path, "python sweep.py", dry_run=True) == fake_run_sweep.returns
    assert fake_run_sweep.calls[0]["dry_run"] is True


def test_multirun_hands_the_whole_grid_to_run_sweep_once(sweep_app, fake_run_sweep, tmp_path, capsys):
    sweep_dir = tmp_path / "multirun"
    fake_run_sweep.returns = {}  # what a dry run returns: it runs nothing
    sweep_app("-m", "model=llama,phi3", "phase.batch=2", f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.dry_run=true")
    (call,) = fake_run_sweep.calls
    assert [c.model.name for c in call["configs"]] == ["llama", "phi3"]
    assert call["overrides"] == [["model=llama", "phase.batch=2"], ["model=phi3", "phase.batch=2"]]
    assert call["out_dir"] == sweep_dir
    assert call["command"] == "python sweep.py -m model=llama,phi3 phase.batch=2"
    assert call["dry_run"] is True
    assert call["grid"]["exclude"] == [] and call["grid"]["max_variants"] is None
    assert call["grid"]["groups"]["backend"] == sorted(p.stem for p in (CONF / "backend").glob("*.yaml"))
    # the driver's lines: as they are on stdout, and in the sweep's log file
    assert "phasesweep: fake sweep of 2 config(s)\n" in capsys.readouterr().out
    assert "phasesweep: fake sweep of 2 config(s)" in (sweep_dir / "sweep.log").read_text()


def test_multirun_exits_with_the_failed_variants(sweep_app, fake_run_sweep, tmp_path):
    fake_run_sweep.returns = {0: Outcome("llama_prefill_onnxruntime_cpu", Status.FAILED)}
    with pytest.raises(SystemExit) as exit_:
        sweep_app("-m", "model=llama", f"hydra.sweep.dir={tmp_path}")
    assert exit_.value.code == "phasesweep: 1 variant(s) failed: llama_prefill_onnxruntime_cpu"


def test_single_run_goes_through_the_same_path(sweep_app, fake_run_sweep, tmp_path, capsys):
    run_dir = tmp_path / "run"
    sweep_app("model=phi3", f"hydra.run.dir={run_dir}")
    (call,) = fake_run_sweep.calls
    assert [c.model.name for c in call["configs"]] == ["phi3"]
    assert call["overrides"] == [["model=phi3"]]
    assert Path(call["out_dir"]) == run_dir
    assert call["dry_run"] is False
    assert "phasesweep: fake sweep of 1 config(s)\n" in capsys.readouterr().out
    assert "phasesweep: fake sweep of 1 config(s)" in (run_dir / "sweep.log").read_text()


def test_a_local_sweep_hands_run_sweep_an_export_server_begun_before_its_jobs_were_composed(sweep_app, fake_run_sweep, tmp_path):
    """The export server imports torch and transformers while the driver composes and plans
    (orchestrator.launcher.warm_forks); whatever run_sweep did, it is gone when launch returns."""
    sweep_app("-m", "model=llama", f"hydra.sweep.dir={tmp_path}")
    (call,) = fake_run_sweep.calls
    (pid,) = call["servers"]  # this process's child, serving the folder run_sweep was handed
    assert gone(pid) and not call["folder"].exists()


@pytest.mark.parametrize("when", ["starting", "composing"])
def test_a_ctrl_c_before_the_run_began_is_one_line_and_leaves_no_server(sweep_app, monkeypatch, tmp_path, capsys, when):
    """Ctrl-C before orchestrator.entry's own handling: while Hydra starts (sweep.py's imports,
    its help check) or while the jobs are composed, after the export server was begun for them.
    Status 130, one line, no traceback; the server ends with the driver's exit path."""
    import orchestrator.help
    import orchestrator.launcher

    servers: list[int] = []
    warm = orchestrator.launcher.warm_forks

    def warmed(config, dry_run):
        forks = warm(config, dry_run)
        servers.extend(servers_of(forks))
        return forks

    def interrupted(*args, **kwargs):  # where Python's handler would raise it
        raise KeyboardInterrupt

    monkeypatch.setattr(orchestrator.launcher, "warm_forks", warmed)
    if when == "starting":
        monkeypatch.setattr(orchestrator.help, "fast_help", interrupted)
    else:
        monkeypatch.setattr(orchestrator.launcher, "JobConfigs", interrupted)
    with pytest.raises(SystemExit) as ended:
        sweep_app("-m", "model=llama", f"hydra.sweep.dir={tmp_path}")
    assert ended.value.code == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "phasesweep: interrupted (SIGINT); no run was open" and "Traceback" not in err
    assert len(servers) == (1 if when == "composing" else 0) and all(gone(pid) for pid in servers)


@pytest.mark.parametrize("override", ["hydra.launcher.dry_run=true", "cluster=ray", "cluster.fork_server=false"])
def test_a_dry_run_a_cluster_to_join_or_no_fork_servers_begins_no_server_early(sweep_app, fake_run_sweep, tmp_path, override):
    fake_run_sweep.returns = {}
    sweep_app("-m", "model=llama", f"hydra.sweep.dir={tmp_path}", override)
    assert fake_run_sweep.calls[0]["forks"] is None
