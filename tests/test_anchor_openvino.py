"""scripts/anchors/openvino.py: the OpenVINO contenders of the side-by-side benchmark (the stateful
IR by phasesweep's session, set back or growing, and openvino_genai.LLMPipeline on the same folder)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openvino_genai", reason="pip install openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0")


@pytest.mark.slow
def test_each_contender_prepares_calls_and_the_pipeline_decodes_greedily_as_transformers(tmp_path):
    import openvino as ov
    import openvino_genai as og
    import torch

    from scripts.anchors import openvino as anchor
    from tasks.model.models import build_model
    from tests.conftest import model_spec

    model = build_model(model_spec("llama"))
    model.save_pretrained(tmp_path / "ckpt")  # no tokenizer: the export writes one over the ids
    contenders = anchor.build(tmp_path / "ckpt", tmp_path / "work", threads=1)
    assert set(contenders) == {"phasesweep", "phasesweep_growing", "genai_pipeline"}
    for name in ("phasesweep", "phasesweep_growing"):
        decode, prefill = contenders[name].decode(24), contenders[name].prefill(16)
        for _ in range(3):
            getattr(decode, "rewind", lambda: None)()
            decode()
            getattr(prefill, "rewind", lambda: None)()
            prefill()
    timed = contenders["genai_pipeline"].decode(24)
    assert len(timed.block(4)) == 4 and len(contenders["genai_pipeline"].prefill(16).block(2)) == 2

    pipe = contenders["genai_pipeline"]._pipe(anchor.PhaseSpec("decode", batch=1, context_len=24, parity_steps=anchor.PARITY_STEPS))
    prompt = np.random.default_rng(1).integers(3, 512, (1, 12), dtype=np.int64)
    config = og.GenerationConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    config.ignore_eos = True
    got = pipe.generate(og.TokenizedInputs(ov.Tensor(prompt), ov.Tensor(np.ones_like(prompt))), config).tokens[0]
    with torch.no_grad():
        ref = model.generate(torch.from_numpy(prompt), max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert list(got) == ref[0, 12:].tolist()
