"""The revision of the code a sweep measured: this repository's commit and dirty state, and
those of every module a config names that lives in another git checkout (a runtime or export
format by module path, a captured phase's application). Read with `git` once per sweep; a
folder that is not a git checkout (or a machine without git) records nothing.

Tags (on the sweep's run and on each variant's run it concerns), filterable in MLflow as
`tags.code.commit = '...'`:

    code.commit, code.dirty, code.committed     this repository (committed: the commit's date)
    code.<module>.commit, .dirty, .committed    an out-of-tree module (e.g. code.spin_runtime.commit)
    code.<module>.root                          the checkout it was found in
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from orchestrator.plan.planner import Plan
from orchestrator.plan.variant import Variant
from tasks.registry import load_module

HERE = Path(__file__).resolve().parent  # inside this repository's checkout
GIT_TIMEOUT_S = 10.0


def _git(folder: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):  # no git, or a hung file system
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@cache  # once per checkout per process: a sweep asks for each variant's modules
def checkout(folder: Path) -> tuple[str, str, bool, str] | None:
    """(top folder, commit, dirty, the commit's committer date) of the git checkout holding
    `folder`; None when it is none."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    commit = _git(folder, "log", "-1", "--format=%H %cI") if top else None
    if not top or not commit:
        return None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    sha, _, date = commit.partition(" ")
    return top, sha, bool(status), date


def module_file(module: str, search: Iterable[str] = ()) -> Path | None:
    """Where a module's source is, without importing it: the first `a/b/c.py` or
    `a/b/c/__init__.py` under `search` and sys.path."""
    parts = module.split(".")
    for base in (*search, *sys.path):
        root = Path(base or ".")
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate.resolve()
    return None


def loaded_file(key: str, name: str, package: str) -> tuple[str, Path | None]:
    """(module name, its file) of a runtime or format the config names (tasks.registry's lookup:
    the planner imported it already to read its contract)."""
    module = load_module(key, name, package)
    found = getattr(module, "__file__", None)  # a namespace package has none
    return module.__name__, Path(found).resolve() if found else None


def named_modules(v: Variant, search: Iterable[str] = ()) -> dict[str, Path | None]:
    """{module: its file} of the modules a variant's config names: its runtime, its export
    format, a captured phase's application (`package.module:function`, not imported here)."""
    named = dict(
        [
            loaded_file("backend.runtime", v.backend.runtime or v.backend.name, "tasks.runtimes"),
            loaded_file("backend.export_format", v.backend.export_format, "tasks.export"),
        ]
    )
    if v.phase.app:
        app = v.phase.app.partition(":")[0]
        named[app] = module_file(app, search)
    return named


def tags_of(label: str, found: tuple[str, str, bool, str]) -> dict[str, str]:
    """code.[label]commit, .dirty, .committed (the commit's date: history's commit order) and,
    for an out-of-tree module, .root."""
    top, commit, dirty, date = found
    tags = {f"code.{label}commit": commit, f"code.{label}dirty": str(dirty), f"code.{label}committed": date}
    return tags | ({f"code.{label}root": top} if label else {})


class Revisions:
    """The revisions of one sweep's code, read once: `sweep` (the sweep run's tags) and
    `of(name)` (a variant run's: a skipped variant's modules are not looked up, it ran nothing)."""

    def __init__(self, plan: Plan, search: Iterable[str] = ()):
        own = checkout(HERE)
        self.own = tags_of("", own) if own else {}
        self.sweep = dict(self.own)
        self.variants: dict[str, dict[str, str]] = {}
        seen: dict[str, dict[str, str]] = {}
        for pv in plan.variants:
            tags = dict(self.own)
            for module, path in named_modules(pv.variant, search).items():
                if module not in seen:
                    seen[module] = outside(module, path, own[0] if own else None)
                tags.update(seen[module])
            self.variants[pv.name] = tags
            self.sweep.update(tags)

    def of(self, name: str) -> dict[str, str]:
        return self.variants.get(name, self.own)


def outside(module: str, path: Path | None, own_top: str | None) -> dict[str, str]:
    """A module's tags when it is in a git checkout other than this repository's; else none."""
    found = checkout(path.parent) if path else None
    if found is None or found[0] == own_top:
        return {}
    return tags_of(f"{module}.", found)


def short(tags: dict[str, str], label: str = "") -> str | None:
    """`abc1234d` or `abc1234d+dirty` of the tags' revision (`label`: a module's), None without one."""
    commit = tags.get(f"code.{label}commit")
    if not commit:
        return None
    return commit[:10] + ("+dirty" if tags.get(f"code.{label}dirty") == "True" else "")


def revision_lines(tags: dict[str, str]) -> list[str]:
    """The summary's lines naming what code was measured, from a sweep run's code.* tags."""
    lines = [f"code: {s}" for s in [short(tags)] if s]
    modules = sorted({k.removeprefix("code.").rsplit(".", 1)[0] for k in tags if k.endswith(".root")})
    lines += [f"code of {m}: {short(tags, m + '.')} ({tags[f'code.{m}.root']})" for m in modules]
    return lines


def library_lines(envs: dict[str, dict[str, str]]) -> list[str]:
    """One line naming the library versions the variants ran with, from each variant's `env.*`
    tags (tasks/measure/environment.py, recorded per variant): a library at one version is
    named once, one at several with the variants of each."""
    seen: dict[str, dict[str, list[str]]] = {}
    for name, env in envs.items():
        for key, version in env.items():
            if key.startswith("env.version."):
                seen.setdefault(key.removeprefix("env.version."), {}).setdefault(version, []).append(name)
    parts = []
    for lib, versions in sorted(seen.items()):
        if len(versions) == 1:
            parts.append(f"{lib} {next(iter(versions))}")
        else:
            parts += [f"{lib} {v} ({', '.join(names)})" for v, names in sorted(versions.items())]
    return [f"libraries: {', '.join(parts)}"] if parts else []
