"""The registries: phases, export formats and runtimes are modules found by name, each with
its facts in one place; a backend is a runtime module plus a yaml, wherever both live."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from numbers import Real
from pathlib import Path

import pytest
import yaml

from tasks.contract import ExportFormat, Runtime
from tasks.export import format_module
from tasks.phases import phase_module, phase_names
from tasks.registry import available
from tasks.runtimes import runtime_module
from tasks.specs import DEVICES, DTYPE_BYTES, PhaseSpec
from tests.conftest import CONF, ROOT, SHAPE_OVERRIDES, backend_yaml

FORMATS = available("tasks.export")
RUNTIMES = available("tasks.runtimes")
PHASE_PROTOCOL = (
    "normalize",
    "check",
    "tokens_per_call",
    "io_names",
    "make_data",
    "build_graph",
    "check_parity",
    "extra_metrics",
)


def backend_yamls() -> dict[str, dict]:
    return {p.stem: backend_yaml(p.stem) for p in sorted((CONF / "backend").glob("*.yaml"))}


def test_phases_are_the_yamls_of_conf_phase():
    yamls = {p.stem for p in (CONF / "phase").glob("*.yaml")}
    assert set(phase_names()) == yamls == {"prefill", "decode", "captured"}
    for name in phase_names():
        assert yaml.safe_load((CONF / "phase" / f"{name}.yaml").read_text())["name"] == name


@pytest.mark.parametrize("name", phase_names())
def test_every_phase_module_follows_the_protocol(name):
    module = phase_module(name)
    missing = [f for f in PHASE_PROTOCOL if not callable(getattr(module, f, None))]
    assert not missing, f"tasks/phases/{name}.py lacks {missing}"
    keys = getattr(module, "NAMING_KEYS", None)
    assert isinstance(keys, tuple) and all(k.startswith("phase.") for k in keys), f"tasks/phases/{name}.py NAMING_KEYS"
    kinds = ("prefill", "decode") if name == "captured" else (None,)  # a captured call has its kind's graph
    for kind in kinds:
        inputs, outputs = module.io_names(PhaseSpec(name, 1, kind=kind), 2)
        assert inputs and outputs[0] == "logits" and len(set(inputs + outputs)) == len(inputs) + len(outputs)


def test_registries_are_not_empty_and_hide_private_modules():
    assert {"onnx", "executorch", "none"} <= set(FORMATS)
    assert {"eager", "compile", "onnxruntime", "executorch"} <= set(RUNTIMES)
    assert not [n for n in (*FORMATS, *RUNTIMES) if n.startswith("_")]  # _shapes.py, _base.py are helpers


def _check_facts(module) -> None:
    assert isinstance(module.LIBRARIES, tuple) and module.LIBRARIES, module.name
    assert all(isinstance(lib, str) for lib in module.LIBRARIES)
    assert isinstance(module.MEMORY_FACTOR, Real) and module.MEMORY_FACTOR >= 1.0
    assert dataclasses.is_dataclass(module.Options)
    module.Options()  # every option has a default


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_module_has_its_facts(name):
    module = format_module(name)
    _check_facts(module)
    assert isinstance(module, ExportFormat)
    assert isinstance(module.RESOURCES, dict) and module.RESOURCES
    assert set(module.RESOURCES) <= {"num_cpus", "num_gpus", "memory", "resources"}
    assert callable(module.export)


@pytest.mark.parametrize("name", RUNTIMES)
def test_every_runtime_module_has_its_facts(name):
    module = runtime_module(name)
    _check_facts(module)
    assert isinstance(module, Runtime)
    assert module.DTYPES and set(module.DTYPES) <= set(DEVICES)  # model dtypes it runs, by device
    assert all(set(dtypes) <= set(DTYPE_BYTES) for dtypes in module.DTYPES.values())


@pytest.mark.parametrize("option", list(backend_yamls()))
def test_every_backend_yaml_names_a_runtime_and_a_format_that_exist(option):
    y = backend_yamls()[option]
    assert y["name"] == option
    assert (y.get("runtime") or y["name"]) in RUNTIMES
    assert y["export_format"] in FORMATS
    assert y["devices"] and set(y["devices"]) <= set(DEVICES)
    runs = runtime_module(y.get("runtime") or y["name"]).DTYPES
    assert all(runs.get(d) for d in y["devices"]), f"{option}: a device its runtime runs no dtype on"


# -- a backend from outside the repository ---------------------------------------------------

# the test-only backend `spin` (tests/spin_backend/): eager plus a busy-wait in every timed call
SPIN = Path(__file__).resolve().parent / "spin_backend"


@pytest.mark.slow
def test_a_new_runtime_is_one_module_and_one_yaml_outside_the_repository(tmp_path, cache_override):
    """A backend the repository does not know (a runtime module on PYTHONPATH and a yaml on
    Hydra's search path) sweeps like any other: exported, parity-checked, measured, recorded."""
    plugin = tmp_path / "plugin"  # the whole backend: one module and one yaml, copied out of the repository
    shutil.copytree(SPIN, plugin, ignore=shutil.ignore_patterns("__pycache__"))
    assert sorted(str(p.relative_to(plugin)) for p in plugin.rglob("*.*")) == [
        "conf/backend/spin.yaml",
        "spin_runtime.py",
    ]
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "sweep.py"),
            "-m",
            "backend=spin",
            "phase=decode",
            f"hydra.searchpath=[file://{plugin / 'conf'}]",
            "bench.min_iters=10",
            "bench.min_seconds=0.1",
            "bench.warmup_max_seconds=0.5",
            "bench.threads=1",
            "backend.options.spin_us=200",
            *SHAPE_OVERRIDES,
            cache_override,  # the session's exports: format none's llama decode entry is eager's
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "llama_decode_spin_cpu" in proc.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("phasesweep")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id], max_results=10)}
    run = runs["llama_decode_spin_cpu"]
    assert run.info.status == "FINISHED"
    assert run.data.tags["status"] == "ok" and run.data.tags["parity"] == "passed"
    assert run.data.tags["backend"] == "spin"
    assert run.data.params["backend.runtime"] == "spin_runtime" and run.data.params["backend.export_format"] == "none"
    assert run.data.params["backend.options.spin_us"] == "200" and run.data.params["runtime.spin_us"] == "200"
    assert run.data.metrics["latency_ms_median"] >= 0.2  # the spin is inside every timed call
    assert run.data.metrics["parity_steps"] == 8

    # nothing of the repository had to change: the package's registries and conf/ know no spin
    assert "spin_runtime" not in available("tasks.runtimes") and "spin" not in backend_yamls()
    assert not [p for d in ("conf", "tasks", "orchestrator") for p in (ROOT / d).rglob("spin*")]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", "conf", "tasks", "orchestrator"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    assert "spin" not in status
