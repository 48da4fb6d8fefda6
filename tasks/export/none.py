"""No artifact: eager-style backends (eager, torch.compile) run the graph module itself.
The export entry still holds the phase's inputs and eager reference."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.specs import QUANTS as QUANT_VALUES

LIBRARIES = ("torch", "transformers")
MEMORY_FACTOR = 1.5  # the model and its reference run
RESOURCES = {"num_cpus": 1}
QUANTS = {"cpu": QUANT_VALUES, "cuda": QUANT_VALUES}  # no file: the runtime quantises what it builds


@dataclass(frozen=True)
class Options:
    pass


def export(graph, args, input_names, output_names, out_dir: Path, options: dict[str, Any], description):
    return None, {}, None  # no file to describe or take apart
