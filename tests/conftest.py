"""Shared fixtures: tiny model specs straight from conf/, and exports made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.specs import ModelSpec, PhaseSpec

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def model_spec(name: str, **changes) -> ModelSpec:
    """The tiny preset of conf/model/<name>.yaml as a ModelSpec."""
    cfg = yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text())
    arch = dict(cfg["sizes"]["tiny"])
    fields = {k: cfg[k] for k in ("name", "family", "dtype", "seed", "kv_cache", "attention")}
    return ModelSpec(size="tiny", arch=arch, **{**fields, **changes})


PREFILL = PhaseSpec("prefill", batch=2, prompt_len=16)
DECODE = PhaseSpec("decode", batch=2, context_len=24, parity_steps=8)


@pytest.fixture(scope="session")
def onnx_exports(tmp_path_factory):
    """ONNX exports of both tiny models, both phases: {(model, phase): ExportResult}."""
    from tasks.jobs import export_job
    from tasks.specs import ExportSpec

    root = tmp_path_factory.mktemp("onnx_exports")
    out = {}
    for model in ("llama", "phi3"):
        for phase in (PREFILL, DECODE):
            spec = ExportSpec(
                f"{model}-{phase.name}", model_spec(model), phase, "onnx", str(root / f"{model}_{phase.name}")
            )
            result = export_job(spec)
            assert result.ok, result.failure and result.failure.traceback
            out[(model, phase.name)] = result
    return out
