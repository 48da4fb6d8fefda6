"""The rooms of orchestrator/ and tasks/ stack as floors: a module imports only from its own
room or the rooms below it (anywhere in the file, imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# lowest first; a room is a subpackage, or a top-level module named by its stem
FLOORS = {
    "orchestrator": [("common",), ("plan",), ("record",), ("read",), ("run",), ("entry", "launcher", "compare", "report", "replay")],
    "tasks": [("specs", "registry", "contract"), ("measure",), ("worker",), ("model",), ("export",), ("phases",), ("runtimes",), ("jobs", "paired")],
}


def floor_of(package: str, dotted: str) -> int | None:
    parts = dotted.split(".")
    if parts[0] != package or len(parts) < 2:
        return None
    return next((i for i, rooms in enumerate(FLOORS[package]) if parts[1] in rooms), None)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of everything a file imports, relative imports resolved."""
    here = module_name(path, root).split(".")
    pkg = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            # `from tasks import jobs` names the room in the alias
            out += [(node.lineno, base if len(base.split(".")) > 1 else f"{base}.{a.name}") for a in node.names]
    return out


def back_arrows(package: str, root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        mine = floor_of(package, module_name(path, root))
        for line, name in imports_of(path, root) if mine is not None else []:
            theirs = floor_of(package, name)
            if theirs is not None and theirs > mine:
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(set(found))


def test_every_module_sits_on_a_floor():
    for package in FLOORS:
        loose = [
            str(p.relative_to(ROOT))
            for p in (ROOT / package).rglob("*.py")
            if p != ROOT / package / "__init__.py" and floor_of(package, module_name(p, ROOT)) is None
        ]
        assert loose == [], f"{package}: modules on no floor (add their room to FLOORS)"


def test_orchestrator_rooms_import_only_downwards():
    assert back_arrows("orchestrator") == []


def test_tasks_rooms_import_only_downwards():
    assert back_arrows("tasks") == []


def test_the_floor_check_sees_an_import_upwards(tmp_path):
    measure = tmp_path / "tasks" / "measure"
    measure.mkdir(parents=True)
    (measure / "probe.py").write_text(
        "from tasks.specs import PAST\n"
        "def f():\n"
        "    from tasks.jobs import export_job\n"
        "    from ..model import families\n"
        "    from tasks import worker\n"
        "    from . import bench\n"
    )
    assert back_arrows("tasks", tmp_path) == [
        "tasks/measure/probe.py:3 imports tasks.jobs",
        "tasks/measure/probe.py:4 imports tasks.model",
        "tasks/measure/probe.py:5 imports tasks.worker",
    ]


def test_no_product_module_is_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for folder in ("orchestrator", "tasks", "hydra_plugins")
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}
