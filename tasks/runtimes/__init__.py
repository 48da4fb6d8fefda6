"""One module per backend, each exposing `load(spec, meta) -> Session` (see base.py).

A new backend is one new file here plus one yaml in conf/backend/.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def runtime_module(backend: str) -> ModuleType:
    try:
        return importlib.import_module(f"tasks.runtimes.{backend}")
    except ModuleNotFoundError as e:
        if e.name == f"tasks.runtimes.{backend}":
            raise ValueError(f"backend={backend!r} has no runtime module tasks/runtimes/{backend}.py") from e
        raise
