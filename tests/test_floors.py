"""The rooms of orchestrator/ and tasks/ stack as floors: a module imports only from its own
room or the rooms below it (anywhere in the file, imports inside functions included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

# lowest first; a room is a subpackage, or a top-level module named by its stem
FLOORS = {
    "orchestrator": [("common",), ("plan",), ("record",), ("read",), ("run",), ("entry", "launcher", "help", "compare", "report", "replay", "bisect")],
    "tasks": [("specs", "registry", "contract"), ("measure",), ("worker",), ("model",), ("export",), ("phases",), ("runtimes",), ("jobs", "paired", "quality_windows", "depth_series", "app_loop")],
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


# -- import hygiene: no circles, no other file's private names, lazy imports say why ---------------

PACKAGES = ("orchestrator", "tasks")
def modules_of(root: Path) -> dict[str, Path]:
    """{dotted name: file} of every module of PACKAGES (a package by its __init__.py)."""
    return {module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}


def _statements(path: Path, root: Path) -> list[tuple[ast.stmt, str, list[str]]]:
    """(node, module it imports from, the names it takes) of each import in the file, relative
    imports resolved; `import a.b` takes no names."""
    here = module_name(path, root).split(".")
    pkg = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            out.append((node, base, [a.name for a in node.names]))
    return out


def project_imports(path: Path, root: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, project module) of everything a file imports: `from a import b` is module a.b when
    that is a module, else a."""
    found = []
    for node, base, names in _statements(path, root):
        targets = [f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names] or [base]
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a.b
                target = target.rpartition(".")[0]
            if target:
                found.append((node.lineno, target))
    return found


def import_circles(root: Path = ROOT) -> list[str]:
    """Each circle of imports among the project's modules (module level and inside functions),
    as "a -> b -> a", from the strongly connected components of the import graph."""
    modules = modules_of(root)
    graph = {m: sorted({t for _, t in project_imports(p, root, modules) if t != m}) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(m: str) -> None:  # Tarjan's algorithm
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in graph[m]:
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            group = []
            while (t := stack.pop()) != m:
                group.append(t)
            if group:
                circles.append(_one_circle(graph, {m, *group}, min(group + [m])))

    for m in graph:
        if m not in index:
            visit(m)
    return sorted(circles)


def _one_circle(graph: dict[str, list[str]], group: set[str], start: str) -> str:
    """A shortest path from `start` back to itself inside a strongly connected group."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for m in frontier:
            for t in graph[m]:
                if t == start:
                    return " -> ".join([*paths[m], start])
                if t in group and t not in paths:
                    paths[t] = [*paths[m], t]
                    nxt.append(t)
        frontier = nxt
    return start


def private_imports(root: Path = ROOT) -> list[str]:
    """Imports of another file's private name (`from a.b import _x`, _x a function, class or
    value) and of a private module from outside its own package (a room's `_mod` is the room's)."""
    modules = modules_of(root)
    found = []
    for me, path in modules.items():
        where = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node, base, names in _statements(path, root):
            if base.split(".")[0] not in PACKAGES:
                continue
            for dotted in [f"{base}.{n}" for n in names] or [base]:
                parts = dotted.split(".")
                for i, part in enumerate(parts):
                    if not part.startswith("_") or part.startswith("__"):
                        continue
                    owner = ".".join(parts[:i])
                    is_module = ".".join(parts[: i + 1]) in modules
                    if not is_module or not (where == owner or where.startswith(owner + ".")):
                        found.append(f"{path.relative_to(root)}:{node.lineno} imports {dotted}")
                        break
    return sorted(set(found))


def _says_why(line: str) -> bool:
    """A comment on the line that is more than a linter's directive."""
    _, hash_, comment = line.partition("#")
    words = re.sub(r"noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^]]*\])?", "", comment)
    return bool(hash_ and words.strip(" -:"))


def _reason_above(lines: list[str], lineno: int) -> bool:
    """A comment line alone right above the import, or above the imports right above it (one
    reason serves the block of imports under it)."""
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].strip().startswith("#") and _says_why(lines[i])


def unexplained_lazy_imports(root: Path = ROOT) -> list[str]:
    """Imports inside a function without a reason: a comment on their first line, or on the line
    before them alone (one reason may serve the imports under it)."""
    found = []
    for path in modules_of(root).values():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = [n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)]
            for node in sorted(body, key=lambda n: n.lineno):
                if not (_says_why(lines[node.lineno - 1]) or _reason_above(lines, node.lineno)):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(set(found))


def test_no_import_circles():
    assert import_circles() == []


def test_nothing_imports_another_files_private_name():
    assert private_imports() == []


def test_every_lazy_import_says_why():
    found = unexplained_lazy_imports()
    assert found == [], "a function-level import without its reason: move it to the top, or say why it is lazy"


def test_the_hygiene_checks_see_a_circle_a_private_name_and_an_unexplained_lazy_import(tmp_path):
    pkg = tmp_path / "tasks" / "model"
    pkg.mkdir(parents=True)
    (tmp_path / "tasks" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_private.py").write_text("def _helper(): ...\n")
    (pkg / "a.py").write_text("from tasks.model import b\nfrom tasks.model._private import _helper\nfrom . import _private\n")
    (pkg / "b.py").write_text(
        "def f():\n"
        "    from tasks.model import a  # lazy: only to show a circle\n"
        "    # lazy: torch, only in a job's process\n"
        "    import torch\n"
        "    import torch.nn\n"
        "\n"
        "    import json\n"
        "    import os  # noqa: F401\n"
    )
    (tmp_path / "tasks" / "other.py").write_text("from tasks.model._private import x\n")
    assert import_circles(tmp_path) == ["tasks.model.a -> tasks.model.b -> tasks.model.a"]
    assert private_imports(tmp_path) == [
        "tasks/model/a.py:2 imports tasks.model._private._helper",
        "tasks/other.py:1 imports tasks.model._private.x",
    ]
    assert unexplained_lazy_imports(tmp_path) == ["tasks/model/b.py:7: import json", "tasks/model/b.py:8: import os  # noqa: F401"]


def long_functions(root: Path = ROOT, limit: int = 60) -> list[str]:
    """`file:line name (N lines)` of every function of PACKAGES longer than `limit` lines."""
    out = []
    for path in modules_of(root).values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return out


def test_no_function_a_reader_cannot_hold():
    """None over 60 lines in orchestrator/ and tasks/: a long one is split by meaning, into steps with names."""
    assert long_functions() == []

