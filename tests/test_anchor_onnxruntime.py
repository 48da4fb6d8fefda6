"""scripts/anchors/onnxruntime.py: the three ONNX Runtime contenders of the side-by-side benchmark."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime_genai", reason="pip install 'phasesweep[genai]'")


@pytest.mark.slow
def test_each_contender_prepares_parity_checked_calls_and_the_generator_decodes_greedily_as_transformers(tmp_path, monkeypatch):
    import torch

    from scripts.anchors import onnxruntime as anchor
    from tasks.model.models import build_model
    from tests.conftest import model_spec

    model = build_model(model_spec("llama"))
    model.save_pretrained(tmp_path / "ckpt")
    monkeypatch.setattr(anchor, "GENERATOR_BUDGET", 3)
    contenders = anchor.build(tmp_path / "ckpt", tmp_path / "work", threads=1)
    assert set(contenders) == {"phasesweep_torch", "phasesweep_genai", "genai_generator"}
    for contender in contenders.values():
        decode, prefill = contender.decode(24), contender.prefill(16)
        for _ in range(5):  # past the generator's budget: it prepares a fresh one
            assert decode() is None
        assert prefill() is None

    generator = contenders["genai_generator"]
    prompt = generator._prompt(12)
    g = generator._generator(prompt, 12 + 6)
    while not g.is_done():
        g.generate_next_token()
    with torch.no_grad():
        ref = model.generate(torch.from_numpy(prompt.astype(np.int64)), max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert g.get_sequence(0).tolist() == ref[0].tolist()
