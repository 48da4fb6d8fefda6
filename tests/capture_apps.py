"""Applications the capture tests run (phase.app=tests.capture_apps:<function>)."""

from __future__ import annotations

import torch

SEEN: list[dict] = []  # record(): what the model returned at each call, for the fidelity test


def raises(model):
    model.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=2)
    raise ValueError("the application's own bug")


def never_calls(model):
    return model.config.vocab_size


def beams(model):
    """Beam search reorders its cache between calls: not an append-only cache."""
    prompt = torch.randint(3, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    return model.generate(prompt, num_beams=3, max_new_tokens=6, min_new_tokens=6, do_sample=False, early_stopping=False)


def embeds(model):
    """inputs_embeds instead of input_ids: no phasesweep graph takes embeddings."""
    x = model.get_input_embeddings()(torch.ones(1, 4, dtype=torch.long))
    with torch.no_grad():
        model(inputs_embeds=x)


def record(model, prompt: int = 12, new: int = 10, batch: int = 2):
    """A hand-written greedy loop over a batch; keeps every call's logits in SEEN."""
    SEEN.clear()
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1))
    cache = None
    with torch.no_grad():
        for _ in range(new):
            out = model(input_ids=ids, cache=cache, use_cache=True)
            SEEN.append({"logits": out.logits[:, -1:].clone(), "ids": ids.clone()})
            cache = out.cache
            ids = out.logits[:, -1:].argmax(-1)
