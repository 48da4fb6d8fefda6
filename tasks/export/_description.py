"""What an exported file says about itself, written into the file: a `.onnx` or `.pte` found on
disk tells which model and phase it holds, its inputs and outputs with shapes and dtypes, its
KV-cache layout and capacity, and the phasesweep that made it, read back with the runtime alone.

- ONNX: `metadata_props`, one `phasesweep.<field>` entry each (ONNX Runtime:
  `InferenceSession(...).get_modelmeta().custom_metadata_map`).
- ExecuTorch: constant methods, as ExecuTorch's own Llama export records `get_max_seq_len` and
  friends: `phasesweep_description` (the whole description as JSON) plus the Llama runner's
  integer getters (`Runtime.get().load_program(path).load_method(name).execute([])`).

An export is shared by every variant of the same model, phase and format options (the cpu and
cuda variants of one ONNX file): the file names that content (`phasesweep.name`, e.g.
`llama-tiny_decode`) and its export key; the variants measured with it are MLflow's runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from importlib import metadata
from typing import Any

from tasks.specs import PAST, ExportSpec

CACHE_LAYOUT = ["batch", "kv_heads", "seq", "head_dim"]  # every past_key_values.* input and present.* output
METHOD = "phasesweep_description"  # the .pte's constant method holding the description as JSON


def _version() -> str:
    try:
        return metadata.version("phasesweep")
    except metadata.PackageNotFoundError:
        return "unknown"


def describe(
    spec: ExportSpec,
    dims: dict[str, int],
    inputs: dict[str, tuple[list[int], str]],
    outputs: dict[str, tuple[list[int], str]],
) -> dict[str, Any]:
    """The description of one export: `inputs`/`outputs` are {name: (shape, dtype)} in call order."""
    m = spec.model
    past = [shape for name, (shape, _) in inputs.items() if name.startswith(PAST)]
    if not past:
        capacity = None  # prefill: no cache comes in; the present.* outputs hold the prompt
    elif m.kv_cache == "dynamic":
        capacity = dims["max_positions"] - 1  # the cache grows up to the model's positions
    else:
        capacity = past[0][2]
    model = {k: v for k, v in asdict(m).items() if k not in ("name", "arch")}  # the content, not the preset's label
    return {
        "name": f"{m.family}-{m.size}_{spec.phase.name}",
        "export_key": spec.key,
        "export_format": spec.export_format,
        "phasesweep_version": _version(),
        "model": model,
        "dims": dims,
        "phase": asdict(spec.phase),
        "dtype": m.dtype,
        "inputs": {n: {"shape": s, "dtype": d} for n, (s, d) in inputs.items()},
        "outputs": {n: {"shape": s, "dtype": d} for n, (s, d) in outputs.items()},
        "kv_cache": {"layout": CACHE_LAYOUT, "implementation": m.kv_cache, "capacity": capacity},
    }


def onnx_metadata(description: dict[str, Any]) -> dict[str, str]:
    """`phasesweep.<field>`: strings as they are, everything else as JSON."""
    return {f"phasesweep.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in description.items()}


def from_onnx_metadata(props: dict[str, str]) -> dict[str, Any]:
    """The description back from an ONNX file's metadata map (what onnx_metadata wrote: its
    non-string fields are JSON objects)."""
    return {
        key.removeprefix("phasesweep."): json.loads(value) if value.startswith("{") else value
        for key, value in props.items()
        if key.startswith("phasesweep.")
    }


def executorch_methods(description: dict[str, Any]) -> dict[str, Any]:
    """Constant methods of the .pte: the description as JSON, and the getters ExecuTorch's
    Llama runner reads (`get_max_seq_len`, ...), where they apply."""
    dims, cache = description["dims"], description["kv_cache"]
    phase = description["phase"]
    methods: dict[str, Any] = {
        METHOD: json.dumps(description, sort_keys=True),
        "get_vocab_size": dims["vocab"],
        "get_n_layers": dims["layers"],
        "get_max_batch_size": phase["batch"],
        "use_kv_cache": cache["capacity"] is not None,
        "enable_dynamic_shape": cache["implementation"] == "dynamic",
    }
    if cache["capacity"] is not None:
        methods["get_max_seq_len"] = cache["capacity"]
    return methods
