"""One module per export format, each exposing
`export(graph, args, input_names, output_names, out_dir, options) -> (artifact_name, details)`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from tasks.specs import EXPORT_FORMATS as FORMATS


def exporter(export_format: str) -> ModuleType | None:
    """The module for a format; None for 'none' (eager-style backends keep no artifact)."""
    if export_format not in FORMATS:
        raise ValueError(f"backend.export_format={export_format!r} is unknown; choose one of {', '.join(FORMATS)}")
    if export_format == "none":
        return None
    return importlib.import_module(f"tasks.export.{export_format}")
