"""env.pip end to end: a sweep over two released onnxruntime versions, each variant made and
measured in its own environment and recorded with its version, then again reusing the
environments; and `orchestrator.bisect --pip` naming the first version of a library (local
wheels made here) at which a runtime's parity breaks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.bisect import main
from tests.conftest import SHAPE_OVERRIDES
from tests.test_envs import wheel

VERSIONS = ("1.29.0", "1.30.0")  # released onnxruntime versions that install beside the pinned stack (numpy 2, protobuf 7)
FAST = ["bench.min_seconds=0.1", "bench.max_seconds=1.0", "bench.target_ci=0.5", "bench.quality=false"]


def reachable(pin: str, tmp: Path) -> bool:
    """pip can fetch `pin`'s wheel (a package registry, or pip's own cache)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(tmp), pin],
        capture_output=True, timeout=300,
    )
    return done.returncode == 0


def variant_runs(uri: str) -> dict[str, list]:
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "phasesweep"]
    runs: dict[str, list] = {}
    for run in client.search_runs([exp.experiment_id], "tags.`phasesweep.role` = 'variant'", order_by=["start_time ASC"]):
        runs.setdefault(run.info.run_name, []).append(run)
    return runs


@pytest.mark.slow
def test_a_sweep_over_two_onnxruntime_versions_runs_each_in_its_own_reused_environment(tmp_path, sweep_in_tmp, capsys):
    if not all(reachable(f"onnxruntime=={v}", tmp_path / "wheels") for v in VERSIONS):
        pytest.skip("no package registry: onnxruntime's released wheels cannot be fetched")
    swept = "env.pip=" + ",".join(f'"onnxruntime=={v}"' for v in VERSIONS)
    argv = ["-m", swept, "phase=decode", *SHAPE_OVERRIDES, *FAST, f"cluster.export_cache={tmp_path / 'cache'}"]
    names = [f"llama_decode_onnxruntime_cpu_onnxruntime-{v}" for v in VERSIONS]
    sweep_in_tmp(*argv)
    first = capsys.readouterr().out
    sweep_in_tmp(*argv, "tracking.resume=false")
    second = capsys.readouterr().out
    runs = variant_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted(runs) == sorted(names)
    for name, version in zip(names, VERSIONS, strict=True):
        made, again = runs[name]
        for run in (made, again):
            assert run.info.status == "FINISHED" and run.data.tags["parity"] == "passed"
            assert run.data.tags["env.version.onnxruntime"] == version  # the env's, not the driver's 1.31.1
            assert run.data.params["env.pip"] == f'["onnxruntime=={version}"]'
        assert made.data.params["export.env_made"] == "True" and made.data.params["runtime.env_made"] == "False"
        assert again.data.params["runtime.env_made"] == "False"  # the export was a cache hit: its env untouched
        built, reused = float(made.data.params["export.env_seconds"]), float(again.data.params["runtime.env_seconds"])
        print(f"{name}: environment built in {built:.1f} s, reused in {reused:.2f} s")
        assert reused < built
        assert re.search(rf"exported  {name} .*env built in", first), first
        assert re.search(rf"measured  {name} .*env reused in", second), second
    assert len(list((tmp_path / "cache" / "envs").glob("*/ready.json"))) == 2


RUNTIME = '''"""Eager, with the logits its parity check and its quality read offset by psw_offset.OFFSET and
noised by psw_offset.NOISE (relative to each row's spread): the library whose versions the test searches."""

import numpy as np

from tasks.contract import Runtime
from tasks.runtimes.eager import EagerRuntime


def changed(x, offset, noise, rng):
    x = np.asarray(x)
    spread = np.linalg.norm(x - x.mean(-1, keepdims=True), axis=-1, keepdims=True) / np.sqrt(x.shape[-1])
    return (x + offset + noise * spread * rng.standard_normal(x.shape)).astype(x.dtype)


class OffsetRuntime(Runtime):
    LIBRARIES = ("torch", "transformers", "psw_offset")
    DTYPES = {"cpu": ("float32",)}
    QUANTS = EagerRuntime.QUANTS

    def load(self, spec, meta, feeds):
        import psw_offset  # the environment's version: env.pip pins it
        from tasks.runtimes import eager

        session = eager.RUNTIME.load(spec, meta, feeds)
        run_steps, rng = session.run_steps, np.random.default_rng(0)
        session.run_steps = lambda *a, **k: [changed(x, psw_offset.OFFSET, psw_offset.NOISE, rng) for x in run_steps(*a, **k)]
        return session


RUNTIME = OffsetRuntime()
'''
BACKEND = "name: offset_rt\nruntime: offset_runtime\nexport_format: none\ndevices: [cpu]\nexport_options: {}\noptions: {}\n"


# what a release from 1.3 on changes, and how the search that finds it is asked: a constant
# offset breaks parity (softmax ignores it: quality unchanged); noise of 5% of the logits' spread
# stays within int8's parity bound (10%) and flips the top-1 token of a random model's flat logits
SEARCHES = {
    "parity": ({"OFFSET": 1.0, "NOISE": 0.0}, ["bench.quality=false"], "broke parity"),
    "quality": ({"OFFSET": 0.0, "NOISE": 0.05}, ["model.quant=int8", "bench.quality=true", "bench.quality_tokens=32"], "lost quality"),
}


@pytest.mark.slow
@pytest.mark.parametrize("metric", sorted(SEARCHES))
def test_a_version_bisect_names_the_first_release_that_breaks(tmp_path, monkeypatch, capsys, metric):
    change, settings, said = SEARCHES[metric]
    wheels, module = tmp_path / "wheels", tmp_path / "module"
    (module / "conf" / "backend").mkdir(parents=True)
    wheels.mkdir()
    (module / "offset_runtime.py").write_text(RUNTIME)
    (module / "conf" / "backend" / "offset_rt.yaml").write_text(BACKEND)
    versions = ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5"]
    for v in versions:
        values = change if v >= "1.3" else {"OFFSET": 0.0, "NOISE": 0.0}
        wheel(wheels, "psw_offset", v, body="".join(f"{k} = {x}\n" for k, x in values.items()))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.syspath_prepend(str(module))  # the runtime module: the driver validates with it, spawned children import it
    argv = ["--pip", "psw_offset==" + ",".join(versions), "--metric", metric, "--",
            "backend=offset_rt", "phase=decode", "bench.threads=1", *SHAPE_OVERRIDES, *FAST, *settings,
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"cluster.export_cache={tmp_path / 'cache'}",
            f"hydra.searchpath=[file://{module / 'conf'}]"]
    status = main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"first bad version: psw_offset==1.3 ({said})" in out.splitlines(), out
    measured = {line.split()[2] for line in out.splitlines() if line.startswith("[step ") and "measuring" not in line}
    assert measured <= {f"psw_offset=={v}" for v in versions} and len(measured) <= 4, out  # 1.0, 1.5 and at most two between
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (search,) = client.search_runs([client.get_experiment_by_name("phasesweep").experiment_id], "tags.`phasesweep.role` = 'bisect'")
    assert search.data.tags["first_bad_version"] == "psw_offset==1.3"
