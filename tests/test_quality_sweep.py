"""scripts/train_tiny.py and quality end to end: a short training run gives a checkpoint that
phasesweep's checkpoint reader accepts and whose loss fell, and a sweep over it records quality
(KL, top-1, perplexity against float32 eager) for float16 eager, ONNX Runtime and ExecuTorch, and
marks a float32 variant as the reference itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import ROOT, compose_jobs

pytestmark = pytest.mark.slow


def _train_tiny():
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "scripts" / "train_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict[str, float]]:
    """A few steps of train_tiny at a small size: enough for the loss to fall."""
    out = tmp_path_factory.mktemp("tiny-ckpt")
    tiny = _train_tiny()
    args = tiny.parse(["--out", str(out), "--steps", "12", "--batch", "4", "--seq", "32", "--vocab", "512",
                       "--hidden", "64", "--layers", "1", "--head-dim", "32", "--max-positions", "256", "--threads", "1"])  # fmt: skip
    return out, tiny.train(args)


def test_a_short_training_run_loads_and_learned(trained):
    from tasks.model.checkpoint import read_checkpoint

    folder, figures = trained
    ckpt = read_checkpoint(str(folder))
    assert ckpt.family == "llama" and ckpt.config["num_key_value_heads"] < ckpt.config["num_attention_heads"]
    assert (folder / "tokenizer.json").is_file()
    assert figures["last_loss"] < figures["first_loss"] - 0.5
    assert figures["held_out_ppl"] < 512  # below a uniform guess over the vocabulary


def test_a_sweep_over_it_records_quality_for_every_backend(trained, tmp_path, mlflow_db, cache_override):
    from mlflow.tracking import MlflowClient

    from orchestrator.run.sweep import run_sweep

    folder, _ = trained
    uri = mlflow_db(tmp_path)
    common = [cache_override, f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'mlartifacts'}",
              f"model.checkpoint={folder}"]  # fmt: skip
    half = [[f"phase={p}", f"backend={b}", "model.dtype=float16", *common] for p in ("prefill", "decode") for b in ("eager", "onnxruntime", "executorch")]  # fmt: skip
    configs, overrides = compose_jobs(*half, ["phase=decode", "backend=onnxruntime", *common])
    outcomes = run_sweep(configs, overrides, tmp_path / "out", "pytest: quality")
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("phasesweep").experiment_id], max_results=50)
    variants = {r.info.run_name: r for r in runs if r.data.tags.get("phasesweep.role") != "sweep"}
    assert len(variants) == 7, sorted(variants)
    (name,) = [n for n, r in variants.items() if r.data.params["model.dtype"] == "float32"]
    reference = variants.pop(name)  # float32, unquantised: the reference itself
    assert reference.data.metrics["quality_reference"] == 1.0 and "quality_kl" not in reference.data.metrics
    assert "the reference itself" in reference.data.params["export.quality_inputs"]
    for name, run in variants.items():
        m = run.data.metrics
        assert run.data.tags.get("status") == "ok", (name, run.data.tags)
        assert m["quality_top1"] >= 0.9 and 0 < m["quality_kl"] < 0.05, (name, m)  # float16: near its float32 reference
        assert abs(m["quality_ppl_increase"]) < 0.05 and m["quality_ppl"] == pytest.approx(m["quality_ppl_ref"], rel=0.05)
        assert 1 < m["quality_ppl_ref"] < 512 and m["quality_tokens"] >= 32
        assert "text" in run.data.params["export.quality_inputs"]
    sweep = next(r for r in runs if r.data.tags.get("phasesweep.role") == "sweep")
    logged = {a.path for a in client.list_artifacts(sweep.info.run_id, "plots")}
    assert "plots/speed_vs_quality.png" in logged
    assert outcomes is not None
