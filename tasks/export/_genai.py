"""backend.export_options.exporter=genai: the model built by onnxruntime-genai's model builder
(onnxruntime_genai.models.builder), ONNX Runtime's own LLM exporter, instead of torch.onnx.

The builder reads a Hugging Face folder (config.json, safetensors, a tokenizer) and writes
model.onnx with ONNX Runtime's fused contrib ops (GroupQueryAttention, RotaryEmbedding,
SkipSimplifiedLayerNormalization), genai_config.json and the tokenizer. Its graph takes
input_ids, attention_mask, past_key_values.{i}.key/value [B, H_kv, past, D] and returns
logits and present.*. Its GroupQueryAttention runs either of phasesweep's caches: dynamic
(present grows by the call's tokens) or static (a buffer with free slots, written in place);
tasks/export/onnx_io.py maps the phases' feeds to it.

The top half is torch-free: the driver asks unsupported() at plan time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.export._onnx_quant import genai_options

if TYPE_CHECKING:
    import torch

# model.family -> the transformers architecture the builder dispatches on (config.architectures[0]);
# the one place a family is admitted to the genai exporter
ARCHITECTURES = {"llama": "LlamaForCausalLM", "phi3": "Phi3ForCausalLM"}
# model.dtype -> the builder's precision on the CPU execution provider: its fp16 CPU model builds
# but does not run there (onnxruntime 1.31.1: a Cast in repeat_kv fails on a shape mismatch)
PRECISIONS = {"float32": "fp32"}
INSTALL = "pip install 'phasesweep[genai]' (onnxruntime-genai==0.18.0)"
# builder options: logits of the last position only ([B, 1, V]), as phasesweep's own graphs
# return and as generation reads them
EXTRA_OPTIONS = ["prune_lm_head=true"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def available() -> bool:
    return importlib.util.find_spec("onnxruntime_genai") is not None


def unsupported(model: Any, phase: Any, device: str) -> str | None:
    """Why the genai exporter cannot make this point (a planned skip), or None. `model` has
    family, dtype, kv_cache, attention; `phase` is the normalised PhaseSpec."""
    if not available():
        return f"exporter=genai needs onnxruntime-genai, which is not installed: {INSTALL}"
    if model.family not in ARCHITECTURES:
        return (
            f"exporter=genai builds model.family in {', '.join(ARCHITECTURES)} "
            f"(tasks/export/_genai.py ARCHITECTURES), not {model.family!r}"
        )
    if device != "cpu":
        return (
            "exporter=genai builds for the CPU execution provider only: the builder's CUDA model is another "
            "file (fp16/bf16 GroupQueryAttention), and ONNX exports are shared by every device"
        )
    if model.dtype not in PRECISIONS:
        return f"exporter=genai on cpu builds model.dtype in {', '.join(PRECISIONS)} (the builder's CPU precisions that run), not {model.dtype}"
    if model.attention != "sdpa":
        return f"exporter=genai: the builder chooses its own attention (GroupQueryAttention); model.attention={model.attention} applies to exporter=torch"
    if phase.app is not None:
        return "exporter=genai runs the synthetic phases (prefill, decode), not phase=captured"
    return None


# -- the build (torch, transformers, onnxruntime_genai) -----------------------------------------
@contextlib.contextmanager
def original_attention(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The transformers model as it was before tasks/model/graphs.py swapped its attention
    (the same weights), so save_pretrained writes transformers' own parameter names."""
    layers = model.model.layers
    swapped = [layer.self_attn for layer in layers]
    for layer in layers:
        layer.self_attn = getattr(layer.self_attn, "original", layer.self_attn)
    try:
        yield model
    finally:
        for layer, attn in zip(layers, swapped, strict=True):
            layer.self_attn = attn


def write_tokenizer(folder: Path, vocab_size: int, checkpoint: str | None) -> str:
    """The tokenizer the builder loads (AutoTokenizer) and copies beside the model: the
    checkpoint's own files when it has them, else a word-level tokenizer over the model's
    ids (`t0` .. `t{V-1}`); phasesweep feeds token ids and never tokenizes text."""
    if checkpoint:
        found = [p for p in (Path(checkpoint) / n for n in TOKENIZER_FILES) if p.is_file()]
        if found:
            for p in found:
                shutil.copy(p, folder / p.name)
            return "checkpoint"
    from tokenizers import Tokenizer, models  # lazy: tokenizers, only in a job's process

    # lazy: transformers, only in a job's process
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0").save_pretrained(str(folder))
    return "word-level over the model's ids"


def build(
    model: torch.nn.Module,
    family: str,
    dtype: str,
    checkpoint: str | None,
    out_dir: Path,
    quant: str = "none",
    group: int = 32,
) -> dict[str, Any]:
    """model.onnx (+ .data), genai_config.json and the tokenizer in out_dir, built from the
    model's weights as transformers saves them, quantised by the builder's own int4/int8
    precision for model.quant (tasks/export/_onnx_quant.py GENAI). Returns details for the
    export's meta."""
    # lazy: onnxruntime-genai, only in a job's process
    import onnxruntime_genai

    # lazy: onnxruntime-genai, only in a job's process
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    architecture = model.config.architectures[0] if model.config.architectures else ARCHITECTURES[family]
    if architecture != ARCHITECTURES[family]:
        raise ValueError(f"model.family={family}: the model is a {architecture}, the builder expects {ARCHITECTURES[family]}")
    log = io.StringIO()
    # staged beside the entry (the export cache's disk, not /tmp: a 1B model stages 5 GB), gone before it is sealed
    with tempfile.TemporaryDirectory(prefix=".genai-staging-", dir=out_dir) as work:
        hf, cache = Path(work) / "hf", Path(work) / "cache"
        with original_attention(model):
            model.config.architectures = [architecture]
            model.save_pretrained(str(hf), safe_serialization=True)
        tokenizer = write_tokenizer(hf, model.config.vocab_size, checkpoint)
        precision, extra, quant_details = PRECISIONS[dtype], EXTRA_OPTIONS, {}
        if quant != "none":
            precision, quant_extra, quant_details = genai_options(quant, group)
            extra = [*EXTRA_OPTIONS, *quant_extra]
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                options = parse_extra_options(None, str(hf), str(out_dir), precision, "cpu", str(cache), extra)
                create_model(None, str(hf), str(out_dir), precision, "cpu", str(cache), **options)
        except Exception as exc:
            tail = "\n".join(log.getvalue().splitlines()[-20:])
            raise RuntimeError(f"onnxruntime-genai's model builder failed: {exc}\n{tail}") from exc
    return {
        "exporter": "genai",
        "genai_version": onnxruntime_genai.__version__,
        "genai_precision": precision,
        "genai_tokenizer": tokenizer,
        **quant_details,
    }
