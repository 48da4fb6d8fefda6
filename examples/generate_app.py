"""An application to capture: Hugging Face generate() over a prompt, as a chat or completion
service runs it. phasesweep calls `run(model)` with the model it built and records every
forward call generate() makes:

    python sweep.py -m phase=captured phase.app=examples.generate_app:run backend=onnxruntime,executorch

The prompt is seeded token ids (the tiny presets have no tokenizer); greedy decoding, so
every run makes the same calls. PROMPT_TOKENS and NEW_TOKENS are the loop's shape.
"""

from __future__ import annotations

import torch

PROMPT_TOKENS = 128
NEW_TOKENS = 300
BATCH = 1


def run(model: torch.nn.Module, prompt_tokens: int = PROMPT_TOKENS, new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    """Generate `new_tokens` tokens after a seeded prompt of `prompt_tokens`; returns the ids."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (BATCH, prompt_tokens), generator=gen)
    return model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # no early stop at an end-of-sequence token: a fixed-length loop
        do_sample=False,
        pad_token_id=model.config.pad_token_id,
    )
