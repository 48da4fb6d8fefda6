"""What an exported file says about itself: model and phase, inputs and outputs with shapes and
dtypes, KV-cache layout and capacity, the phasesweep that made it. Each format writes it into
its file in its own way (tasks/export/<format>.py), readable with the runtime alone. It names
the content (`llama-tiny_decode`) and export key, not a variant: variants share an export.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib import metadata
from typing import Any

from tasks.specs import IN_GRAPH_KV_CACHES, PAST, ExportSpec

CACHE_LAYOUT = ["batch", "kv_heads", "seq", "head_dim"]  # every past_key_values.* input and present.* output
IN_GRAPH_LAYOUT = ["batch", "seq", "kv_heads", "head_dim"]  # an in-graph cache's buffers (update_cache)


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
    layout = CACHE_LAYOUT
    if m.kv_cache in IN_GRAPH_KV_CACHES:  # buffers inside the program, not inputs
        capacity, layout = spec.phase.cache_len or spec.phase.prompt_len, IN_GRAPH_LAYOUT
    elif not past:
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
        "kv_cache": {
            "layout": layout,
            "implementation": m.kv_cache,
            "capacity": capacity,
            "in_graph": m.kv_cache in IN_GRAPH_KV_CACHES,
        },
    }
