"""OpenVINO IR made by OpenVINO's own LLM exporter: optimum-intel's `export openvino`
(its command line, task text-generation-with-past, stateful: tasks/export/_optimum_intel.py),
from the variant's transformers model saved as a Hugging Face folder (a local checkpoint's own
files, linked), with weight compression by NNCF for model.quant (QUANT_ARGS). The artifact is
the IR's stem (ARTIFACT): openvino_model.xml and .bin, beside the tokenizer's IR.

The IR is stateful: its KV cache is OpenVINO state inside the model (ReadValue/Assign), not
inputs and outputs. It takes input_ids, attention_mask, position_ids and beam_idx and returns
logits [B, n, V] (the runtime slices the head to the last position); the state grows by each call's tokens and is reset between sequences
(tasks/runtimes/openvino_stateful.py). The format keeps its cache (OWN_CACHE): the phase's
data carries the context's tokens.

optimum-intel 2.2.0 requires transformers<5.6, older than the driver's, so the exporter runs
in a process of its own with ENV's libraries first on its import path: an environment made once
per node beside the export cache (tasks/worker/envs.py), as env.pip makes one; every other
library (torch, openvino, numpy) is the driver's. What fails to install fails the export with
pip's reason. The reference (the phase's data, parity and quality inputs) is the driver's
transformers, as for every other format.

The top half is torch-free: the driver asks refuses() at plan time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.contract import ExportFormat, Point, Refusal
from tasks.export._anatomy import summary
from tasks.export._genai import TOKENIZER_FILES, write_tokenizer
from tasks.export._optimum_intel import DONE, MODEL_XML
from tasks.specs import EnvSpec
from tasks.worker import envs

# the exporter's environment, the one place it is pinned: optimum-intel and what it needs that the
# driver's environment lacks or holds at another version (transformers, huggingface-hub, tokenizers)
ENV = EnvSpec(
    tuple(
        sorted(
            (
                "optimum-intel==2.2.0",
                "optimum==2.3.0",
                "transformers==5.5.4",
                "huggingface-hub==1.21.0",
                "tokenizers==0.22.2",
                "nncf==3.4.0",
                "ninja==1.13.2",
                "pydot==4.0.1",
                "psutil==7.2.2",
                "openvino-tokenizers==2026.4.1.0",
                "httpx==0.28.1",
                "httpcore==1.0.9",
                "h11==0.16.0",
                "anyio==4.16.0",
                "typer==0.25.1",
            )
        )
    )
)
# requirements of ENV's libraries left out on purpose, with why (tasks/worker/envs.py waived)
WAIVED = {
    "torchvision": "optimum-intel requires it for its vision models; the registry's wheel is built for CUDA torch "
    "and, beside the driver's torch+cpu, breaks transformers' import (torchvision::nms does not exist); "
    "a causal LM's export never imports it",
}
EXPORT_TIMEOUT_S = 3600.0
# the artifact is the IR's two files' stem, as a sweep globs an artifact's files (`name*`: the .xml
# and its weights, the .bin; not the tokenizer's IR); the runtime reads ARTIFACT + ".xml"
ARTIFACT = MODEL_XML.removesuffix(".xml")
# families optimum-intel 2.2.0 exports and whose IR gave transformers' logits to 1e-4 on the tiny
# presets, decode through the state (tests/test_openvino_ir.py); NOT_EXPORTED: what it said of the others
FAMILIES = ("llama", "phi3", "qwen2", "qwen3", "mistral", "granite", "olmo2", "smollm3")
NOT_EXPORTED = {
    family: "optimum-intel 2.2.0 exports it with transformers 5.0 at most ('Maximum required is 5.0'), and the "
    "exporter's environment holds transformers 5.5.4 (tasks/export/openvino_ir.py ENV)"
    for family in ("gemma2", "gemma3")
}
# model.quant -> `optimum-cli export openvino`'s weight options (NNCF weight compression,
# data-free): int8 symmetric per output channel; int4 symmetric in groups of model.quant_group
# over every linear layer (ratio 1.0), NNCF keeping the embeddings and the output head at its
# int8 backup precision; none: fp32, no compression (left to itself optimum-intel compresses a
# model of 1B weights or more to int8)
QUANT_ARGS = {
    "none": ["--weight-format", "fp32"],
    "int8": ["--weight-format", "int8", "--sym", "--group-size", "-1"],
    "int4": ["--weight-format", "int4", "--sym", "--ratio", "1.0"],
    "8da4w": ["--weight-format", "int4", "--sym", "--ratio", "1.0"],  # the runtime quantises activations per group
}
# the IR keeps its own cache (OWN_CACHE), as llama.cpp's context does: model.kv_cache does not choose it, so
# the default (static) plans it once and the other values, which would make the same IR again, are skipped
_CACHE = (
    "the IR keeps its KV cache as OpenVINO state, which grows by each call's tokens, whatever model.kv_cache says: "
    "the default, model.kv_cache=static, plans it once"
)
MOVEMENT = {
    "transposes": frozenset({"Transpose"}),
    "copies": frozenset({"Gather", "Concat", "Broadcast"}),
    "casts": frozenset({"Convert"}),
}


def quant_args(quant: str, group: int) -> list[str]:
    """The command line's weight options for model.quant (int4's group: model.quant_group)."""
    args = list(QUANT_ARGS[quant])
    return [*args, "--group-size", str(group)] if "int4" in args else args


class OpenvinoIrFormat(ExportFormat):
    # what the export's versions are: the exporter's own are ENV's (in this module, so in the key)
    LIBRARIES = ("torch", "transformers", "openvino")
    REQUIRES = ("openvino",)
    MEMORY_FACTOR = 4.0  # an estimate, not measured: the model, its folder read back by optimum-intel, the trace, the IR
    OWN_CACHE = True
    MOVEMENT = MOVEMENT
    DTYPES = {"cpu": ("float32",)}
    DTYPE_NOTE = (
        "optimum-intel traces the model in float32 and stores float weights as f32 (or f16, weight_format=fp16, "
        "a compression the CPU plugin upcasts): the IR has no float16 or bfloat16 model to match"
    )
    QUANTS = {"cpu": tuple(QUANT_ARGS)}
    QUANT_NOTE = "OpenVINO's weight compression (NNCF): int8, int4, and int4 weights under 8da4w; q4_k_m is llama.cpp's own type"
    REFUSALS = (
        Refusal("model.kv_cache", "dynamic", _CACHE),
        Refusal("model.kv_cache", "update_cache", _CACHE),
    )

    def limits(self, point: Point) -> str | None:
        m = point.model
        if m.family in NOT_EXPORTED:
            return f"backend {point.backend} cannot make model.family={m.family}: {NOT_EXPORTED[m.family]}"
        if m.family not in FAMILIES:
            return f"backend {point.backend}: optimum-intel's exporter is not admitted for model.family={m.family} (tasks/export/openvino_ir.py FAMILIES)"
        if point.phase.app is not None:
            return f"backend {point.backend} runs the synthetic phases (prefill, decode), not phase=captured"
        return None

    def export(self, graph, args, input_names, output_names, out_dir, options, description):
        return export(graph, out_dir, description)


def export(model: Any, out_dir: Path, description: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """openvino_model.xml/.bin (with the tokenizer's IR) in out_dir, made by optimum-intel in its
    own environment from the model's folder."""
    m = description["model"]
    args = quant_args(m.get("quant", "none"), m.get("quant_group", 32))
    description = {**description, "kv_cache": {"implementation": "openvino state", "in_graph": True, "capacity": None}}
    built = envs.ensure(ENV, str(out_dir), tuple(WAIVED))
    # staged beside the entry (the export cache's disk, not /tmp), gone before it is sealed
    with tempfile.TemporaryDirectory(prefix=".optimum-staging-", dir=out_dir) as work:
        source, tokenizer = _source(model, m.get("checkpoint"), Path(work) / "hf")
        request = Path(work) / "request.json"
        request.write_text(json.dumps({"model": str(source), "out": str(out_dir), "args": args, "description": description}))
        said = run_exporter(built.site, request)
    details = {
        "exporter": "optimum-intel",
        "ov_exporter_versions": said["versions"],
        "ov_weight_options": " ".join(args),
        "ov_tokenizer": tokenizer,
        "ov_tokenizer_ir": bool(said["tokenizer_ir"]),
        "ov_exporter_env_seconds": round(built.seconds, 3),
        "ov_exporter_env_made": built.made,
    }
    return ARTIFACT, details, anatomy(out_dir / MODEL_XML)


def _source(model: Any, checkpoint: str | None, folder: Path) -> tuple[Path, str]:
    """The Hugging Face folder optimum-intel loads: a local checkpoint's own files (linked), else
    the built model saved (a preset's seeded random weights); with a word-level tokenizer over
    the model's ids where it has none (optimum-intel converts it to the tokenizer's IR)."""
    if checkpoint and Path(checkpoint).is_dir():
        folder.mkdir(parents=True)
        for f in Path(checkpoint).iterdir():
            (folder / f.name).symlink_to(f.resolve())
        if any((folder / name).exists() for name in TOKENIZER_FILES):
            return folder, "checkpoint"
    else:
        model.save_pretrained(str(folder), safe_serialization=True)
    return folder, write_tokenizer(folder, model.config.vocab_size, None)


def run_exporter(site: str, request: Path) -> dict[str, Any]:
    """tasks/export/_optimum_intel.py in a process whose import path starts with `site`, offline
    (the model is a local folder: optimum-intel would otherwise wait on the Hub). Its JSON line,
    or a RuntimeError with the end of what it printed."""
    path = os.pathsep.join([site, *(p for p in sys.path if p)])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, "-m", "tasks.export._optimum_intel", str(request)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"optimum-intel's export did not finish in {EXPORT_TIMEOUT_S:g} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(DONE)]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        raise RuntimeError(f"optimum-intel's export failed (exit status {done.returncode}):\n{tail}")
    return json.loads(lines[-1].removeprefix(DONE))


def anatomy(xml: Path) -> dict:
    """The IR's ops by type (`Constant` by element type: `const.u4`, `const.f32`), its constants'
    bytes, and the files' size: what optimum-intel and NNCF put inside it."""
    import openvino as ov  # lazy: openvino, only in an export's process

    model = ov.Core().read_model(str(xml))
    ops: Counter = Counter()
    constants = 0
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind in ("Parameter", "Result"):
            continue
        if kind == "Constant":
            ops[f"const.{op.get_element_type().get_type_name()}"] += 1
            constants += op.get_byte_size()
            continue
        ops[kind] += 1
    files = sum(p.stat().st_size for p in (xml, xml.with_suffix(".bin")))
    return summary(ops, Counter(), [], constants, files, MOVEMENT)


FORMAT = OpenvinoIrFormat()
