"""Registries by name: a bare name is a module of a tasks/ package (or, if the package has none
of that name, a top-level module), a dotted name any importable module (so a runtime or format
can live outside this repository). A format's module defines FORMAT, a runtime's RUNTIME: one
object each, of the contract's classes (tasks/contract.py)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType
from typing import TypeVar

from tasks.specs import ConfigError

T = TypeVar("T")


# the object a choice's module defines: public helpers beside them (tasks/export/onnx_io.py) are no choice
OBJECTS = {"tasks.export": "FORMAT", "tasks.runtimes": "RUNTIME"}


@cache  # load_module asks on every lookup: list each package's folder once
def available(package: str) -> tuple[str, ...]:
    """The package's choices: its public modules (that define its OBJECTS entry, where it has one)."""
    pkg = importlib.import_module(package)
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))
    defines = OBJECTS.get(package)
    return tuple(n for n in names if defines is None or defines in vars(importlib.import_module(f"{package}.{n}")))


def _allowed(key: str, name: str, package: str) -> str:
    return f"{key}={name!r} is not allowed; choose one of: {', '.join(available(package))} (or an importable module path)"


def load_module(key: str, name: str, package: str) -> ModuleType:
    # a bare name: the package's module of that name, else a top-level module (spin_runtime.py on sys.path)
    local = "." not in name and name in available(package)
    path = f"{package}.{name}" if local else name
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name is not None and path.startswith(e.name):  # the module itself (or its package) is missing
            raise ConfigError(_allowed(key, name, package)) from None
        raise


@cache  # one object per name: the planner asks for it once per grid point
def load_object(key: str, name: str, package: str, attribute: str, kind: type[T]) -> T:
    """The module's `attribute` (FORMAT, RUNTIME), checked to be an instance of `kind`."""
    module = load_module(key, name, package)
    found = vars(module).get(attribute)
    if not isinstance(found, kind):  # e.g. a bare name that is some other top-level module
        raise ConfigError(
            f"{_allowed(key, name, package)}: module {module.__name__} defines no {attribute} "
            f"(an instance of {kind.__module__}.{kind.__qualname__})"
        )
    return found
