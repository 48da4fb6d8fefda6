"""env.pip: the config's pins validated before any work, their place in variant names, params and
keys, and the environment a node makes of them (tasks/worker/envs.py) from a local wheel."""

from __future__ import annotations

import base64
import hashlib
import pkgutil
import zipfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.plan.config import validate, validate_all
from orchestrator.plan.grid import grid_rules
from orchestrator.plan.planner import make_plan
from tasks.specs import ConfigError, EnvSpec, check_pins
from tasks.worker import envs
from tasks.worker.fresh import in_fresh_process
from tests.conftest import capacity, compose_jobs, plan_jobs

ORT_A, ORT_B = '"onnxruntime==1.29.0"', '"onnxruntime==1.30.0"'


@pytest.mark.parametrize(
    "value, pins",
    [
        (None, ()),
        ("onnxruntime==1.30.0", ("onnxruntime==1.30.0",)),
        ([" onnx==1.19.0", "onnxruntime==1.30.0"], ("onnx==1.19.0", "onnxruntime==1.30.0")),
        (["onnxruntime==1.30.0", "onnx==1.19.0"], ("onnx==1.19.0", "onnxruntime==1.30.0")),  # sorted: one env
    ],
)
def test_pins_are_read_as_one_sorted_tuple(value, pins):
    assert check_pins("env.pip", value) == pins


@pytest.mark.parametrize(
    "value, why",
    [
        ("onnxruntime>=1.29", "exact pins NAME==VERSION"),
        ("onnxruntime", "exact pins NAME==VERSION"),
        ([3], "exact pins NAME==VERSION"),
        ({"onnxruntime": "1.30.0"}, "exact pins NAME==VERSION"),
        (["onnxruntime==1.29.0", "ONNXRuntime==1.30.0"], "pins one library twice"),
        ("phasesweep==0.1", "pins phasesweep itself"),
    ],
)
def test_a_bad_pin_names_the_key_the_value_and_the_form(value, why):
    with pytest.raises(ConfigError) as e:
        check_pins("env.pip", value)
    assert str(e.value).startswith(f"env.pip={value!r}") and why in str(e.value)


def test_a_bad_pin_stops_the_sweep_before_planning_with_its_job():
    configs, overrides = compose_jobs(["env.pip=onnxruntime"], ["env.pip=null"])
    with pytest.raises(ConfigError, match=r"env.pip='onnxruntime' is not allowed.*\[1 of 2 jobs: #0"):
        validate_all(configs, overrides)


def test_a_config_recorded_before_the_env_group_reads_as_the_drivers_libraries():
    configs, _ = compose_jobs([])
    old = OmegaConf.to_container(configs[0])
    old.pop("env")
    assert validate(OmegaConf.create(old), []).env.spec() == EnvSpec()


def test_each_version_is_a_variant_named_and_keyed_by_its_pins():
    plan = plan_jobs([f"env.pip={ORT_A}", "phase=decode"], [f"env.pip={ORT_B}", "phase=decode"])
    a, b = plan.variants
    assert (a.name, b.name) == ("llama_decode_onnxruntime_cpu_onnxruntime-1.29.0", "llama_decode_onnxruntime_cpu_onnxruntime-1.30.0")
    assert a.variant.params["env.pip"] == '["onnxruntime==1.29.0"]'
    assert a.bench.env == EnvSpec(("onnxruntime==1.29.0",))
    assert plan.exports[a.export_key].spec.env == a.bench.env  # the export is made in the env too
    assert a.export_key != b.export_key and a.variant.bench_key != b.variant.bench_key
    assert a.bench.export_dir != b.bench.export_dir  # never one export for two versions


def test_a_single_env_still_names_its_variant_and_the_drivers_own_adds_nothing():
    (pinned,) = plan_jobs([f"env.pip={ORT_B}"]).variants
    (default,) = plan_jobs([]).variants
    (null,) = plan_jobs(["env.pip=null"]).variants
    assert pinned.name == default.name + "_onnxruntime-1.30.0"  # a nightly history never mixes it with the driver's
    assert "env.pip" not in default.variant.params and default.bench.env == EnvSpec()
    assert (null.name, null.export_key, null.variant.bench_key) == (default.name, default.export_key, default.variant.bench_key)
    assert pinned.export_key != default.export_key


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), body: str = "") -> Path:
    """A pure-Python wheel of module `name` whose VERSION is `version` (then `body`), made by hand."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n{body}",
        f"{dist}/METADATA": "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]) + "\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},{len(t)}" for p, t in files.items()]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch) -> Path:
    """pip finds wheels only in this folder (no registry)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def test_an_env_is_made_once_per_node_and_reused(local_index, tmp_path):
    wheel(local_index, "psw_demo", "2.0")
    entry = str(tmp_path / "cache" / "llama_decode_onnx-0123")  # an export cache entry: envs/ goes beside it
    env = EnvSpec(("psw_demo==2.0",))
    first = envs.ensure(env, entry)
    again = envs.ensure(env, entry)
    assert (first.made, again.made) == (True, False)
    assert first.site == again.site and Path(first.site).parent.parent == tmp_path / "cache" / envs.ROOT
    assert first.versions == {"psw-demo": "2.0"}
    assert envs.said(envs.facts(again)).startswith("  env reused in")
    # the child imports the env's module by name (a standard-library function, so it imports
    # nothing of this repository's tests, which a `tests` package elsewhere on its path could shadow)
    version = in_fresh_process(pkgutil.resolve_name, "psw_demo:VERSION", 60, "benchmark", paths=(first.site,))
    assert version == "2.0"


def test_an_env_whose_library_needs_what_the_drivers_lack_is_refused(local_index, tmp_path):
    wheel(local_index, "psw_needy", "1.0", ("numpy<1",))
    with pytest.raises(envs.EnvError, match=r"psw_needy 1.0 needs numpy<1, this environment has 2"):
        envs.ensure(EnvSpec(("psw_needy==1.0",)), str(tmp_path / "cache" / "entry"))
    assert not list((tmp_path / "cache" / envs.ROOT).glob("*/ready.json"))  # nothing half-made is reused


def test_a_version_pip_cannot_find_fails_with_pips_reason(local_index, tmp_path):
    with pytest.raises(envs.EnvError, match=r"env.pip=\['psw_absent==9.9'\]: pip install failed"):
        envs.ensure(EnvSpec(("psw_absent==9.9",)), str(tmp_path / "cache" / "entry"))


def test_two_versions_pair_for_an_interleaved_ab():
    """hydra.launcher.pair=env.pip: each phase's two versions, timed interleaved in one task."""
    configs, overrides = compose_jobs(*[[f"env.pip={pin}", f"phase={phase}"] for pin in (ORT_A, ORT_B) for phase in ("prefill", "decode")])
    plan = make_plan(validate_all(configs, overrides), configs, overrides, capacity(), grid_rules(pair="env.pip"))
    assert plan.pairs == tuple(
        (f"llama_{phase}_onnxruntime_cpu_onnxruntime-1.29.0", f"llama_{phase}_onnxruntime_cpu_onnxruntime-1.30.0")
        for phase in ("prefill", "decode")
    )
