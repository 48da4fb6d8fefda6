"""The quality measurement's door for the jobs: its inputs made with the export (torch side),
measured after timing (numpy side).

The export job tokenises the quality text (bench.quality_text) with the checkpoint's own
tokenizer, or draws seeded tokens where there is none, lets the phase cut it into the
windows its artifact runs (`quality_inputs`), and stores them with the float32, unquantised
eager model's log-probabilities at every predicted position (QUALITY in the entry). The
benchmark, after every timed call, runs the artifact through its own session over the same
windows (`quality_logits`) and compares (tasks/measure/quality.py metrics). A float32,
unquantised variant is that reference itself: its entry says so (REFERENCE) and neither side
computes anything (parity checks that its artifact computes what its model does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.measure.quality import QUALITY, metrics, quality_text
from tasks.model.models import build_model

if TYPE_CHECKING:
    import torch

    from tasks.specs import ExportSpec, ModelSpec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
REFERENCE = "reference"  # the one array of a reference variant's QUALITY: nothing to compare


def make_quality(
    model: torch.nn.Module, phase_mod: Any, spec: ExportSpec, dims: dict[str, int], kv_cache: str | None = None
) -> tuple[dict | None, str]:
    """(the arrays to store in QUALITY, or None; what was measured or why not). Called with the
    variant's own model before its attention is swapped: a decode window's first token is
    cached by it, as parity's context is. `kv_cache`: the cache the artifact keeps, when it is
    not model.kv_cache (a format whose runtime keeps its own: tasks/contract.py OWN_CACHE)."""
    if spec.quality is None:
        return None, "off (bench.quality=false)"
    if is_reference(spec.model):
        return {REFERENCE: np.ones(1, np.int8)}, "not measured: float32 and unquantised, the reference itself"
    if not hasattr(phase_mod, "quality_inputs"):
        return None, f"not measured: phase={spec.phase.name} has no quality windows"
    take, what = _token_source(spec, dims)
    ref = _reference(spec)
    kv_cache = kv_cache or spec.model.kv_cache
    arrays, why = phase_mod.quality_inputs(model, ref, spec.phase, kv_cache, dims, take, spec.quality.tokens)
    if arrays is None:
        return None, f"not measured: {why}"
    if what == "synthetic":
        arrays.pop("q_targets")
    return arrays, f"{what}; {len(arrays['q_ref_logprobs'])} positions"


def _token_source(spec: ExportSpec, dims: dict[str, int]) -> tuple[Callable[[int], torch.Tensor], str]:
    """`take(n)` -> the first n tokens (fewer where the text ends), and what they are."""
    import torch  # lazy: torch, only in a job's process

    ckpt = spec.model.checkpoint
    if ckpt and any((Path(ckpt) / f).is_file() for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer  # lazy: torch, only in a job's process

        text = quality_text(spec.quality.text)
        ids = torch.tensor(AutoTokenizer.from_pretrained(ckpt)(text, add_special_tokens=False)["input_ids"])
        source = spec.quality.text or "held-out pydoc_data topics"
        return (lambda n: ids[:n]), f"text ({source}, {len(ids)} tokens, the checkpoint's tokenizer)"
    gen = torch.Generator().manual_seed(spec.phase.seed + 1)  # not the phase's own tokens
    return (lambda n: torch.randint(0, dims["vocab"], (n,), generator=gen)), "synthetic"


def is_reference(m: ModelSpec) -> bool:
    """Whether the variant computes the reference's numbers: float32 and unquantised."""
    return m.dtype == "float32" and m.quant == "none"


def _reference(spec: ExportSpec) -> torch.nn.Module:
    """The float32, unquantised eager model of a variant that is not it, built again."""
    return build_model(replace(spec.model, dtype="float32", quant="none"))


def measure(session: Any, phase_mod: Any, phase: Any, feeds: dict[str, np.ndarray], export_dir: str) -> dict[str, float]:
    """The artifact's quality through its session, over the stored windows; {} without them."""
    path = Path(export_dir) / QUALITY
    if not path.is_file():
        return {}
    with np.load(path) as z:
        q = {n: z[n] for n in z.files}
    if REFERENCE in q:
        return {"quality_reference": 1.0}
    if not hasattr(phase_mod, "quality_logits"):
        return {}
    logits = phase_mod.quality_logits(session, phase, feeds, q)
    return metrics(logits, q["q_ref_logprobs"], q.get("q_targets"))
