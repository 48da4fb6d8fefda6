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
PHASES = {"prefill": PREFILL, "decode": DECODE}


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """`exported(model, phase, fmt, kv_cache="static")` -> ExportResult, each made once a session."""
    from tasks.jobs import export_job
    from tasks.specs import ExportSpec

    root = tmp_path_factory.mktemp("exports")
    made = {}

    def get(model: str, phase: str, fmt: str, kv_cache: str = "static"):
        key = (model, phase, fmt, kv_cache)
        if key not in made:
            spec = ExportSpec(
                "-".join(key), model_spec(model, kv_cache=kv_cache), PHASES[phase], fmt, str(root / "_".join(key))
            )
            result = export_job(spec)
            assert result.ok, result.failure and result.failure.traceback
            made[key] = result
        return made[key]

    return get


@pytest.fixture(scope="session")
def onnx_exports(exported):
    """ONNX exports of both tiny models, both phases: {(model, phase): ExportResult}."""
    return {(m, p): exported(m, p, "onnx") for m in ("llama", "phi3") for p in ("prefill", "decode")}
