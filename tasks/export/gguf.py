"""GGUF, llama.cpp's file: the transformers model saved as a Hugging Face folder, converted by
llama.cpp's own converter (convert_hf_to_gguf.py's `conversion` package, from the source the
installed llama-cpp-python vendors: tasks/export/gguf_source.py) at the model's dtype (F32,
F16, BF16), then for model.quant quantised by llama.cpp's own quantiser
(llama_cpp.llama_model_quantize): int8 -> Q8_0, int4 -> Q4_0, q4_k_m -> Q4_K_M.

llama.cpp keeps the KV cache inside its context (OWN_CACHE): the phases' data carries the
context's tokens, which the runtime (tasks/runtimes/llamacpp.py) decodes into its own cache.
A model without a tokenizer (the random-weight presets) gets a vocabulary of placeholder
pieces (`t0` .. `t{V-1}`): phasesweep feeds token ids and never tokenizes text.

The top half is torch-free: the driver asks refuses() at plan time.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.contract import ExportFormat, Point, Refusal
from tasks.export._anatomy import summary
from tasks.export._genai import TOKENIZER_FILES
from tasks.export.gguf_source import source_dir

# model.family -> the transformers architecture llama.cpp's converter dispatches on
# (config.architectures[0]); every family of tasks/model/families.py has one
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
}
# families whose llama.cpp logits differ from transformers' (measured on the tiny presets, float32,
# flash attention off): planned as skipped with what was seen, until the cause is found
DIVERGES = {
    "gemma2": "its logits came out 0.24 off transformers' at a prefill of 8 (within the sliding window; soft-capped scores)",
    "gemma3": "its logits came out 0.69 off transformers' at a prefill of 8 (within the sliding window; a rotary base per layer type)",
    "smollm3": "its logits came out 0.22 off transformers' at a prefill of 16 (layers without RoPE, no_rope_layers)",
}
# families the converter maps to llama.cpp's llama architecture, which attends to the whole cache
WHOLE_CACHE = ("mistral",)
OUTTYPES = {"float32": "ALL_F32", "float16": "MOSTLY_F16", "bfloat16": "MOSTLY_BF16"}  # gguf.LlamaFileType
# model.quant -> (llama.cpp's file type, llama_cpp's LLAMA_FTYPE_* constant, its weights per block)
QUANT_TYPES = {
    "int8": ("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0", 32),
    "int4": ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0", 32),
    "q4_k_m": ("Q4_K_M", "LLAMA_FTYPE_MOSTLY_Q4_K_M", 256),
}
ARTIFACT = "model.gguf"
INSTALL = "pip install -e '.[llamacpp]'"
_OWN_CACHE = "llama.cpp keeps its KV cache in its context, allocated for all its cells up front: model.kv_cache=static"


def row_sizes(arch: dict[str, Any]) -> dict[str, int]:
    """The input widths of the linear layers llama.cpp quantises row by row: each row's
    weights are cut into blocks of the type's size."""
    hidden, heads = arch.get("hidden_size"), arch.get("num_attention_heads")
    head_dim = arch.get("head_dim") or (hidden // heads if hidden and heads else None)
    sizes = {
        "hidden_size": hidden,
        "intermediate_size": arch.get("intermediate_size"),
        "num_attention_heads * head_dim": heads * head_dim if heads and head_dim else None,
    }
    return {k: v for k, v in sizes.items() if v}


class GgufFormat(ExportFormat):
    LIBRARIES = ("torch", "transformers", "llama-cpp-python")  # the converter is the package's own source
    REQUIRES = ("llama-cpp-python",)
    MEMORY_FACTOR = 3.0  # the model, its saved folder's weights read back by the converter, the float file
    OWN_CACHE = True
    DTYPES = {"cpu": ("float32", "float16", "bfloat16")}
    DTYPE_NOTE = "llama.cpp runs here on the CPU"
    QUANTS = {"cpu": ("none", *QUANT_TYPES)}
    QUANT_NOTE = (
        "llama.cpp's own types: int8 -> Q8_0, int4 -> Q4_0, q4_k_m -> Q4_K_M; its Q4_0 already multiplies "
        "against int8-quantised activations, so 8da4w is model.quant=int4 here"
    )
    REFUSALS = (
        Refusal("model.kv_cache", "dynamic", _OWN_CACHE),
        Refusal("model.kv_cache", "update_cache", _OWN_CACHE),
    )

    def limits(self, point: Point) -> str | None:
        """Families the converter lacks, the captured phase, and row widths a type's blocks do not divide."""
        m = point.model
        if m.family not in ARCHITECTURES:
            return f"backend {point.backend}: llama.cpp's converter has no model.family={m.family} here (tasks/export/gguf.py ARCHITECTURES)"
        if point.phase.app is not None:
            return f"backend {point.backend} runs the synthetic phases (prefill, decode), not phase=captured"
        if m.family in DIVERGES:
            return f"backend {point.backend} does not run model.family={m.family} yet: {DIVERGES[m.family]}"
        if why := _window(point):
            return why
        if m.quant not in QUANT_TYPES:
            return None
        kind, _, block = QUANT_TYPES[m.quant]
        if m.quant == "int4" and m.quant_group != block:
            return f"backend {point.backend}: llama.cpp's {kind} has blocks of {block} weights, not model.quant_group={m.quant_group}"
        bad = {k: v for k, v in row_sizes(dict(point.arch)).items() if v % block}
        if bad:
            rows = ", ".join(f"{k}={v}" for k, v in bad.items())
            return (
                f"backend {point.backend} cannot make model.quant={m.quant} ({kind}) of this model: its blocks hold {block} "
                f"weights of a row, and {rows} is no multiple of {block} (llama.cpp would fall back to other types)"
            )
        return None

    def export(self, graph, args, input_names, output_names, out_dir, options, description):
        return export(graph, out_dir, description)


def _window(point: Point) -> str | None:
    """A sliding window llama.cpp would not slide (WHOLE_CACHE), shorter than the positions the point's calls hold."""
    window, span = point.arch.get("sliding_window"), point.phase.cache_len or point.phase.prompt_len or 0
    if point.model.family in WHOLE_CACHE and window and span > window:
        return (
            f"backend {point.backend}: llama.cpp runs model.family={point.model.family} as its llama architecture, "
            f"which attends to the whole cache, and the model's sliding_window={window} is shorter than the {span} "
            "positions its calls hold"
        )
    return None


def export(model: Any, out_dir: Path, description: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """model.gguf in out_dir: the model converted at its dtype, quantised for model.quant."""
    m = description["model"]
    quant = m.get("quant", "none")
    description = {**description, "kv_cache": {"implementation": "llama.cpp", "in_graph": True, "capacity": _capacity(description)}}
    path = out_dir / ARTIFACT
    # staged beside the entry (the export cache's disk, not /tmp), gone before it is sealed
    with tempfile.TemporaryDirectory(prefix=".gguf-staging-", dir=out_dir) as work:
        hf = Path(work) / "hf"
        model.config.architectures = [ARCHITECTURES[m["family"]]]
        model.save_pretrained(str(hf), safe_serialization=True)
        vocab = _copy_tokenizer(m.get("checkpoint"), hf, model.config.vocab_size)
        converted = path if quant == "none" else Path(work) / "float.gguf"
        details = convert(hf, converted, OUTTYPES[description["dtype"]], description, vocab)
        if quant != "none":
            details.update(quantize(converted, path, quant))
    return path.name, {**details, "gguf_vocab": vocab}, anatomy(path)


def _capacity(description: dict[str, Any]) -> int:
    phase = description["phase"]
    return phase.get("cache_len") or phase.get("prompt_len") or 0


def _copy_tokenizer(checkpoint: str | None, folder: Path, size: int) -> str:
    """The checkpoint's tokenizer files beside the saved model (the converter's own vocabulary), or
    "placeholder" where it has none, with a word-level tokenizer.json of the placeholder pieces
    (Gemma 3's converter counts its vocabulary there)."""
    found = [p for p in (Path(checkpoint) / n for n in TOKENIZER_FILES) if p.is_file()] if checkpoint else []
    for p in found:
        shutil.copy(p, folder / p.name)
    if found:
        return "checkpoint"
    words = {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(size)}, "unk_token": "t0"}
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "added_tokens": [], "model": words}))
    return "placeholder"


def _converter(source: Path) -> Any:
    """llama.cpp's `conversion` package and its gguf-py, from the pinned source, first on the path
    (as convert_hf_to_gguf.py puts its gguf-py)."""
    for folder in (source, source / "gguf-py"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    import conversion  # lazy: llama.cpp's converter (torch, transformers), only in an export's process

    return conversion


def convert(hf: Path, out: Path, outtype: str, description: dict[str, Any], vocab: str) -> dict[str, Any]:
    """The saved folder as a GGUF file of llama.cpp's type `outtype` (gguf.LlamaFileType), the
    description written into its metadata (`phasesweep.<field>`)."""
    source = source_dir()
    conversion = _converter(source)
    import gguf  # lazy: llama.cpp's gguf-py, put on the path by _converter

    base = conversion.get_model_class(ARCHITECTURES[description["model"]["family"]])
    metadata = {f"phasesweep.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in description.items()}

    class Converter(base):  # type: ignore[misc, valid-type]
        model_arch = base.model_arch  # the converter's registry asks every subclass to name it

        def set_vocab(self) -> None:
            if vocab == "placeholder":
                placeholder_vocab(self.gguf_writer, self.hparams["vocab_size"], gguf)
            else:
                super().set_vocab()

        def set_gguf_parameters(self) -> None:
            super().set_gguf_parameters()
            for key, value in metadata.items():
                self.gguf_writer.add_string(key, value)

    log = io.StringIO()
    logging.getLogger("hf-to-gguf").setLevel(logging.ERROR)  # its progress notes, not the export's
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        Converter(hf, getattr(gguf.LlamaFileType, outtype), out, model_name=description["name"]).write()
    return {"gguf_converter": base.__name__, "gguf_outtype": outtype, "llama_cpp_source": source.parent.parent.name}


def placeholder_vocab(writer: Any, size: int, gguf: Any) -> None:
    """A SentencePiece-style vocabulary of `size` placeholder pieces (llama.cpp's "llama" model;
    ids 0, 1, 2: unknown, begin, end, as its defaults), so llama.cpp sizes its logits by it."""
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([f"t{i}" for i in range(size)])
    writer.add_token_scores([0.0] * size)
    writer.add_token_types([gguf.TokenType.NORMAL] * size)


def quantize(source: Path, out: Path, quant: str) -> dict[str, Any]:
    """`source` quantised by llama.cpp's own quantiser to model.quant's type, one thread."""
    import llama_cpp  # lazy: llama.cpp's library, only in an export's process

    kind, ftype, _ = QUANT_TYPES[quant]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.nthread = 1
    failed = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if failed:
        raise RuntimeError(f"llama.cpp's quantiser failed ({failed}) making {kind} of {source.name}")
    return {"gguf_quant_type": kind}


def anatomy(path: Path) -> dict:
    """The file's tensors by llama.cpp type (`tensor.Q4_0`: how many), their stored bytes, and the
    token embedding as a table read by row where the output head has its own weights."""
    import gguf  # lazy: llama.cpp's gguf-py, put on the path by convert()

    reader = gguf.GGUFReader(str(path))
    types = Counter(f"tensor.{t.tensor_type.name}" for t in reader.tensors)
    sizes = {t.name: (int(t.n_bytes), [int(d) for d in t.shape]) for t in reader.tensors}
    lookups = []
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        nbytes, shape = sizes["token_embd.weight"]
        lookups.append({"bytes": nbytes, "rows": shape[-1]})  # ne order: [hidden, vocab]
    constants = sum(n for n, _ in sizes.values())
    return summary(types, Counter(), [], constants, path.stat().st_size, {}, lookups)


FORMAT = GgufFormat()
