"""Composition of every option of every config group, and clear errors for bad values."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import open_dict

from orchestrator.config import ConfigError, validate
from tests.conftest import CONF, ROOT

GROUPS = ["model", "phase", "backend", "device", "bench", "tracking", "cluster"]


@pytest.fixture
def hydra_compose():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *overrides: compose("sweep", overrides=list(overrides))
    GlobalHydra.instance().clear()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_validates(hydra_compose, group, option):
    cfg = hydra_compose(f"{group}={option}")
    point = validate(cfg)
    assert getattr(point, group) is not None
    if group in ("model", "phase", "backend", "device"):
        assert getattr(point, group).name == option


def test_every_model_size_is_valid(hydra_compose):
    for model in options("model"):
        cfg = hydra_compose(f"model={model}")
        for size in cfg.model.sizes:
            with open_dict(cfg):
                cfg.model.size = size
            assert validate(cfg).model.size == size


def test_launcher_is_ours(hydra_compose):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("sweep", return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("PhaseSweepRayLauncher")


@pytest.mark.parametrize(
    "override,expected",
    [
        ("model.kv_cache=paged", "model.kv_cache='paged' is not allowed; choose one of: static, dynamic"),
        ("model.attention=flash", "model.attention='flash' is not allowed; choose one of: sdpa, math"),
        ("model.size=70b", "model.size='70b' is not allowed; choose one of: tiny, 1b"),
        ("model.dtype=int3", "model.dtype='int3' is not allowed; choose one of: float32, float16, bfloat16"),
        ("phase.batch=0", "phase.batch=0 must be >= 1"),
        ("phase.batch=two", "phase.batch='two'"),
        ("bench.threads=0", "bench.threads=0 must be >= 1 (or null)"),
    ],
)
def test_bad_value_names_key_value_and_choices(hydra_compose, override, expected):
    cfg = hydra_compose(override)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert expected in str(err.value)


def test_unknown_key_lists_allowed_keys(hydra_compose):
    cfg = hydra_compose("+phase.contxt_len=5")
    with pytest.raises(ConfigError, match=r"phase.contxt_len is not a known key; allowed keys: name, batch"):
        validate(cfg)


def test_unknown_group_option_lists_available(hydra_compose):
    with pytest.raises(ConfigCompositionException) as err:
        hydra_compose("backend=tensorrt")
    assert "backend" in str(err.value) and "onnxruntime" in str(err.value.__cause__ or err.value)


def test_bad_override_on_command_line_fails_before_any_work(tmp_path):
    """The driver rejects the value, names it, and starts neither Ray nor MLflow."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), "-m", "model=llama,phi3", "model.kv_cache=paged"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "model.kv_cache='paged' is not allowed; choose one of: static, dynamic" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_driver_imports_no_torch():
    code = (
        "import sys, orchestrator.run, orchestrator.launcher, hydra_plugins.phasesweep_launcher.ray_launcher;"
        "heavy = [m for m in ('torch', 'transformers', 'onnxruntime', 'executorch', 'ray', 'mlflow') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_help_lists_every_group():
    proc = subprocess.run([sys.executable, "sweep.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for group in GROUPS:
        assert f"{group}:" in proc.stdout
