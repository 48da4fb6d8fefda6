"""No artifact: eager-style backends (eager, torch.compile) run the graph module itself.
The export entry still holds the phase's inputs and eager reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.contract import EVERY_QUANT, ExportFormat


class NoFormat(ExportFormat):
    LIBRARIES = ("torch", "transformers")
    MEMORY_FACTOR = 1.5  # the model and its reference run
    QUANTS = EVERY_QUANT  # no file: the runtime quantises what it builds

    def export(self, graph, args, input_names, output_names, out_dir: Path, options: dict[str, Any], description):
        return None, {}, None  # no file to describe or take apart


FORMAT = NoFormat()
