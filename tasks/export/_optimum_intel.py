"""The exporter's own process: `python -m tasks.export._optimum_intel REQUEST.json`, run by
tasks/export/openvino_ir.py with the format's environment (optimum-intel, its transformers,
nncf) first on the import path. It runs optimum-intel's command line, `optimum-cli export
openvino` (its main(), in this process), on a Hugging Face folder, writes the description into
the IR's rt_info (`phasesweep`), and prints one JSON line of what it used.

The command line, not optimum.exporters.openvino.main_export: in optimum-intel 2.2.0 main_export
takes an OVConfig's quantization_config and ignores it (the command line compresses the weights
after it, through a private function), so an int8 export came out float.

The request: {"model": folder, "out": folder, "args": the command line's weight options,
"description": {...}}. Imports nothing of phasesweep: the driver's transformers is not the one
this process imports.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

TASK = "text-generation-with-past"  # a causal LM whose cache the IR keeps (stateful)
MODEL_XML = "openvino_model.xml"
DONE = "phasesweep-optimum-intel: "  # the line the parent reads
VERSIONS = ("optimum-intel", "optimum", "transformers", "nncf", "openvino", "openvino-tokenizers", "torch")


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    import openvino as ov  # lazy: openvino, only when the exporter's process runs

    # lazy: optimum-intel, from the exporter's environment, only when its process runs
    from optimum.commands.optimum_cli import main as optimum_cli

    out = Path(request["out"])
    sys.argv = ["optimum-cli", "export", "openvino", "--model", request["model"], "--task", TASK,
                "--library", "transformers", *request["args"], str(out)]  # fmt: skip
    optimum_cli()  # stateful and with the tokenizer's IR by default
    xml = out / MODEL_XML
    model = ov.Core().read_model(str(xml))
    model.set_rt_info(json.dumps(request["description"]), ["phasesweep"])
    staged = out / f".described-{MODEL_XML}"
    ov.save_model(model, str(staged), compress_to_fp16=False)
    staged.replace(xml)
    staged.with_suffix(".bin").replace(xml.with_suffix(".bin"))
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "none"
    tokenizer = (out / "openvino_tokenizer.xml").is_file()
    print(DONE + json.dumps({"versions": versions, "tokenizer_ir": tokenizer}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
