"""Module registries by name: a bare name is a module of a tasks/ package, a dotted name
any importable module (so a backend or format can live outside this repository)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from tasks.specs import ConfigError


def available(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def load_module(key: str, name: str, package: str) -> ModuleType:
    path = name if "." in name else f"{package}.{name}"
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name is not None and path.startswith(e.name):  # the module itself (or its package) is missing
            raise ConfigError(
                f"{key}={name!r} is not allowed; choose one of: {', '.join(available(package))} "
                "(or an importable module path)"
            ) from None
        raise
