"""A checkpoint folder is read in the driver before any work: its family and name come from
it, and each problem it can have is one line before Ray or MLflow start (tasks/model/checkpoint.py)."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from orchestrator.plan.config import ConfigError
from tasks.model.checkpoint import read_checkpoint
from tasks.model.families import FAMILIES
from tests.conftest import model_spec, plan_jobs


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Tiny llama and phi3 checkpoints by save_pretrained, and the llama one sharded."""
    from tasks.model.models import build_model

    base = tmp_path_factory.mktemp("checkpoints")
    llama = build_model(model_spec("llama"))
    llama.save_pretrained(base / "tiny-llama")
    llama.save_pretrained(base / "sharded", max_shard_size="100KB")
    build_model(model_spec("phi3")).save_pretrained(base / "tiny-phi3")
    return {p.name: p for p in base.iterdir()}


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def header_of(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return length, json.loads(data[8 : 8 + length])


def rename_tensor(folder: Path, old: str, new: str) -> None:
    """Renames a tensor in model.safetensors' header (padded to its length: the data stays put)."""
    path = folder / "model.safetensors"
    data = path.read_bytes()
    length, header = header_of(path)
    header[new] = header.pop(old)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    text = text.ljust(length)
    path.write_bytes(data[:8] + text + data[8 + length :])


def drop_layer(folder: Path) -> None:  # layer 1's tensors renamed to layer 5's
    _, header = header_of(folder / "model.safetensors")
    for name in [n for n in header if ".layers.1." in n]:
        rename_tensor(folder, name, name.replace(".layers.1.", ".layers.5."))


# case -> (how the good llama checkpoint is spoilt, what the one line says)
BROKEN = {
    "no-config": (lambda d: (d / "config.json").unlink(), "no config.json there"),
    "bad-json": (lambda d: (d / "config.json").write_text("{model_type: llama"), "config.json is not readable JSON"),
    "no-model-type": (lambda d: edit_config(d, model_type=None), "config.json has no model_type"),
    "pickle-only": (
        lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
        r"no \*.safetensors weights \(found pytorch_model.bin: pickle weights are never loaded\)",
    ),
    "no-weights": (lambda d: (d / "model.safetensors").unlink(), r"no \*.safetensors weights$"),
    "other-name": (
        lambda d: (d / "model.safetensors").rename(d / "weights.safetensors"),
        "found weights.safetensors but neither model.safetensors nor model.safetensors.index.json",
    ),
    "vocab": (
        lambda d: edit_config(d, vocab_size=1024),
        r"embed_tokens.weight has shape \[512, 64\], config.json implies \[1024, 64\]",
    ),
    "layers": (lambda d: edit_config(d, num_hidden_layers=3), "num_hidden_layers=3; the weights hold layers: 2"),
    "layer-gap": (drop_layer, r"num_hidden_layers=2; the weights hold layers: 2 \(indices 0..5\)"),
    "kv-heads": (
        lambda d: edit_config(d, num_key_value_heads=4),
        r"k_proj.weight has shape \[32, 64\], config.json implies \[64, 64\]",
    ),
    "head-dim": (
        lambda d: edit_config(d, head_dim=8),
        r"q_proj.weight has shape \[64, 64\], config.json implies \[32, 64\]",
    ),
    "truncated": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-100]),
        "model.safetensors is truncated",
    ),
    "garbage": (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 64), "not a readable safetensors file"),
    "moe": (lambda d: edit_config(d, num_local_experts=8), "has mixture-of-experts MLPs \\(num_local_experts\\)"),
    "quantized": (lambda d: edit_config(d, quantization_config={"quant_method": "gptq"}), "quant_method='gptq'"),
    "multimodal": (lambda d: edit_config(d, vision_config={"hidden_size": 8}), "has multimodal towers \\(vision_config\\)"),
    "unknown-family": (
        lambda d: edit_config(d, model_type="starcoder2", architectures=["Starcoder2ForCausalLM"]),
        "config model_type='starcoder2' belongs to no model.family; known: " + ", ".join(f.model_type for f in FAMILIES.values()),
    ),
}


def spoilt(saved: dict[str, Path], tmp_path: Path, case: str) -> Path:
    folder = shutil.copytree(saved["tiny-llama"], tmp_path / case)
    BROKEN[case][0](folder)
    return folder


def refused(sweep_in_tmp, tmp_path: Path, *overrides: str) -> str:
    """The one line a sweep with these overrides exits with, nothing written but Hydra's folder."""
    with pytest.raises(SystemExit) as exit_:
        sweep_in_tmp("-m", "phase=decode", "backend=onnxruntime", *overrides)
    message = str(exit_.value.code)
    assert message.startswith("phasesweep: invalid config:") and len(message.splitlines()) == 2, message
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()
    assert not (tmp_path / ".phasesweep_cache").exists()
    return message.splitlines()[1].strip()


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_checkpoint_is_refused_where_the_worker_loads_it(saved, tmp_path, case):
    from tasks.model.models import check_checkpoint

    with pytest.raises(ConfigError, match=BROKEN[case][1]):
        check_checkpoint(str(spoilt(saved, tmp_path, case)))


SWEPT = ("bad-json", "pickle-only", "kv-heads")  # config.json, the weights' files, their shapes: the rest in the full suite


@pytest.mark.parametrize("case", [c if c in SWEPT else pytest.param(c, marks=pytest.mark.slow) for c in sorted(BROKEN)])
def test_a_broken_checkpoint_is_one_line_before_any_work(saved, tmp_path, sweep_in_tmp, nothing_starts, case):
    folder = spoilt(saved, tmp_path, case)
    line = refused(sweep_in_tmp, tmp_path, f"model.checkpoint={folder}")
    assert line.startswith(f"model.checkpoint='{folder}': "), line
    assert re.search(BROKEN[case][1], line), line


@pytest.mark.parametrize(
    "value,why",
    [("", "empty; name a local Hugging Face model folder"), ("''", "empty"), ("/nonexistent/ckpt", "no such folder")],
)
def test_an_empty_or_missing_path_is_refused_not_the_preset(tmp_path, sweep_in_tmp, nothing_starts, value, why):
    line = refused(sweep_in_tmp, tmp_path, f"model.checkpoint={value}")
    assert line.startswith("model.checkpoint=") and why in line, line


def test_a_file_is_not_a_checkpoint_folder(saved, tmp_path, sweep_in_tmp, nothing_starts):
    line = refused(sweep_in_tmp, tmp_path, f"model.checkpoint={saved['tiny-llama'] / 'config.json'}")
    assert "is not a folder" in line, line


def test_a_chosen_model_of_another_family_is_refused(saved, tmp_path, sweep_in_tmp, nothing_starts):
    line = refused(sweep_in_tmp, tmp_path, "model=phi3", f"model.checkpoint={saved['tiny-llama']}")
    assert line.startswith("model=phi3 (family phi3) and model.checkpoint=") and "(family llama" in line, line
    assert "leave model= out" in line
    line = refused(sweep_in_tmp, tmp_path, "model.family=phi3", f"model.checkpoint={saved['tiny-llama']}")
    assert line.startswith("model.family=phi3 (family phi3) and model.checkpoint="), line


def test_the_checkpoint_chooses_the_family_and_names_the_variants(saved):
    plan = plan_jobs(["phase=decode", f"model.checkpoint={saved['tiny-phi3']}"])  # the default group is llama's
    (pv,) = plan.variants
    assert pv.name == "tiny-phi3_decode_onnxruntime_cpu"
    assert pv.variant.model.family == "phi3" and pv.variant.model.checkpoint == str(saved["tiny-phi3"])
    assert pv.variant.weight_bytes == 558336  # the tensors' own count, float32
    plan = plan_jobs(["phase=prefill", "model=llama", f"model.checkpoint={saved['sharded']}"])
    assert [pv.name for pv in plan.variants] == ["sharded_prefill_onnxruntime_cpu"]
    named = plan_jobs([f"model.checkpoint={saved['tiny-llama']}", "model.name=mine"])
    assert [pv.name for pv in named.variants] == ["mine_prefill_onnxruntime_cpu"]


def test_a_checkpoint_without_model_is_planned_by_the_dry_run(saved, tmp_path, sweep_in_tmp, capsys):
    sweep_in_tmp("-m", "phase=prefill,decode", f"model.checkpoint={saved['tiny-llama']}", "hydra.launcher.dry_run=true")
    out = capsys.readouterr().out
    assert "tiny-llama_prefill_onnxruntime_cpu" in out and "tiny-llama_decode_onnxruntime_cpu" in out, out
    assert "llama_prefill" not in out.replace("tiny-llama_prefill", "")
    assert not (tmp_path / "mlflow.db").exists()


def test_a_folder_name_that_is_no_usable_name_falls_back_to_the_family(saved, tmp_path):
    odd = shutil.copytree(saved["tiny-phi3"], tmp_path / "my model (v2)")
    assert read_checkpoint(str(odd)).name == "phi3"
    snapshot = shutil.copytree(saved["tiny-llama"], tmp_path / "models--org--Tiny-1B" / "snapshots" / ("a" * 40))
    assert read_checkpoint(str(snapshot)).name == "Tiny-1B"  # a Hugging Face cache snapshot: its repository


def test_sharded_checkpoints_are_read_whole(saved, tmp_path):
    ckpt = read_checkpoint(str(saved["sharded"]))
    assert ckpt.shapes == read_checkpoint(str(saved["tiny-llama"])).shapes and ckpt.family == "llama"
    broken = shutil.copytree(saved["sharded"], tmp_path / "sharded")
    (shard := sorted(broken.glob("model-*.safetensors"))[0]).unlink()
    with pytest.raises(ConfigError, match=f"model.safetensors.index.json names shard\\(s\\) not there: {shard.name}"):
        read_checkpoint(str(broken))


def test_checkpoints_in_folders_of_one_name_get_names_of_their_own(saved, tmp_path):
    a = shutil.copytree(saved["tiny-llama"], tmp_path / "a" / "model")
    b = shutil.copytree(saved["tiny-phi3"], tmp_path / "b" / "model")
    names = [pv.name for pv in plan_jobs([f"model.checkpoint={a}"], [f"model.checkpoint={b}"]).variants]
    assert len(set(names)) == 2 and all(n.startswith("model_prefill_onnxruntime_cpu_ckpt-model-") for n in names), names


def test_an_unreadable_weights_file_is_one_line(saved, monkeypatch):
    from tasks.model import checkpoint

    def unreadable(path, refuse):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(checkpoint, "_header", unreadable)
    with pytest.raises(ConfigError, match=r"cannot read .*model.safetensors \(Permission denied\)"):
        read_checkpoint(str(saved["tiny-llama"]))
