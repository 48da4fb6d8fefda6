"""One module per export format. A new format is one module here (or any importable
module named by a backend yaml's `export_format`). Each is importable without torch (the
driver reads its facts) and provides:

  LIBRARIES: tuple[str, ...]   distributions whose versions change what it produces (export key)
  MEMORY_FACTOR: float         an export's peak memory, as a multiple of the weight bytes
  RESOURCES: dict              Ray resources one export asks for, e.g. {"num_cpus": 1}
  Options                      a dataclass of its typed options (backend.export_options);
                               __post_init__ checks values and raises ConfigError
  export(graph, args, input_names, output_names, out_dir, options, description)
      -> (artifact name | None, details, anatomy | None)
                               writes the description (tasks/export/_description.py) into its
                               file and returns the file's anatomy (tasks/export/_anatomy.py)
  MOVEMENT: dict               (with an artifact) its data-movement op names, for the anatomy
  PRELOAD: tuple[str, ...]     (optional) modules its fork server imports once (tasks/worker/forks.py)
  unsupported(options, model, phase, device) -> str | None
                               (optional) why these options cannot make this grid point: the
                               planner skips it with that reason (onnx: the genai exporter's limits)
  name_tag(options) -> str     (optional) what variant names add after the backend's name
                               ("genai": llama_decode_onnxruntime_genai_cpu); "" for nothing
  REFUSES: dict                (optional) {config key: {value: why}}: model choices it cannot
                               express (onnx: model.kv_cache=update_cache), planned as skipped
  QUANTS: dict[str, tuple]     (optional) model.quant values it makes, by device (absent: ("none",));
                               others are planned as skipped with QUANT_NOTE (a str, or {device: str}).
                               export() quantises from description["model"] (quant, quant_group),
                               after the float reference was made (tasks/model/quant.py for torch)
"""

from __future__ import annotations

from types import ModuleType

from tasks.registry import load_module


def format_module(name: str) -> ModuleType:
    """`onnx` -> tasks.export.onnx; a dotted name is imported as it is."""
    return load_module("backend.export_format", name, __name__)
