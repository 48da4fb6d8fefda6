"""Module registries by name: a bare name is a module of a tasks/ package (or, if the
package has none of that name, a top-level module), a dotted name any importable module
(so a backend or format can live outside this repository)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType

from tasks.specs import ConfigError

FACTS = ("LIBRARIES", "MEMORY_FACTOR", "Options")  # what every format and runtime module defines


@cache  # load_module asks on every lookup: list each package's folder once
def available(package: str) -> tuple[str, ...]:
    pkg = importlib.import_module(package)
    return tuple(sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")))


def load_module(key: str, name: str, package: str) -> ModuleType:
    # a bare name: the package's module of that name, else a top-level module (spin_runtime.py on sys.path)
    local = "." not in name and name in available(package)
    path = f"{package}.{name}" if local else name
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name is not None and path.startswith(e.name):  # the module itself (or its package) is missing
            raise ConfigError(
                f"{key}={name!r} is not allowed; choose one of: {', '.join(available(package))} "
                "(or an importable module path)"
            ) from None
        raise
    missing = [fact for fact in FACTS if not hasattr(module, fact)]
    if missing:  # e.g. a bare name that is some other top-level module
        where = package.replace(".", "/") + "/__init__.py"
        raise ConfigError(f"{key}={name!r}: module {module.__name__} lacks {', '.join(missing)}; see {where}")
    return module
