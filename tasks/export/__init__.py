"""One module per export format, each defining FORMAT, an instance of a subclass of
tasks.contract.ExportFormat (what it needs, makes and refuses, and export(): see that class).
A new format is one module here, or any importable module a backend yaml's `export_format`
names; a runtime then runs its files (tasks/runtimes/)."""

from __future__ import annotations

from tasks.contract import ExportFormat
from tasks.export._description import describe  # what every format writes into its file: the jobs' door to it
from tasks.registry import load_object

__all__ = ["describe", "format_module"]


def format_module(name: str) -> ExportFormat:
    """The FORMAT of `onnx` (tasks.export.onnx) or of a dotted module path, as it is."""
    return load_object("backend.export_format", name, __name__, "FORMAT", ExportFormat)
