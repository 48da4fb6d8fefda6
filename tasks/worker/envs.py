"""env.pip's environments: the pinned libraries installed once per node into a folder beside
the export cache's entries (`envs/<pins>-<key>/site`), which the variant's export and benchmark
processes put first on their import path; every other library is the driver's environment's.
Kept across sweeps; a file lock makes one task on a node build it while the others wait.

Not Ray's runtime_env `pip`/`uv`: inside a virtualenv Ray copies the whole environment (torch,
transformers, ... : gigabytes) into its session folder for each env, and a local Ray's session
ends with its sweep, so every sweep would copy it again (docs/regressions.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tasks.specs import EnvSpec, dist_name

ROOT = "envs"  # beside the export cache's entries
READY = "ready.json"  # written last: a folder without it is not an environment
INSTALL_TIMEOUT_S = 900.0


class EnvError(RuntimeError):
    """The environment could not be made: pip failed, or its libraries need what the driver's lack."""


@dataclass(frozen=True)
class Built:
    site: str  # the folder put first on the import path
    seconds: float  # what making it, or finding it made, took in this call
    made: bool  # True: installed by this call; False: reused
    versions: dict[str, str]  # what it holds: distribution -> version


# what an export's details and a benchmark's params hold of its environment (recorded as
# export.env_seconds, runtime.env_seconds, ...): the seconds it took to make or find, whether made
SECONDS, MADE = "env_seconds", "env_made"


def facts(built: Built) -> dict[str, object]:
    return {SECONDS: round(built.seconds, 3), MADE: built.made}


def said(recorded: dict[str, object]) -> str:
    """A progress line's note of the environment in `recorded` (details or params); "" for none."""
    if SECONDS not in recorded:
        return ""
    return f"  env {'built' if recorded[MADE] else 'reused'} in {float(recorded[SECONDS]):.1f}s"


def env_key(env: EnvSpec, waived: Sequence[str] = ()) -> str:
    """The pins and what their wheels are built for: this Python and machine (and the
    requirements its check waives, where any are)."""
    key: dict[str, object] = {"pip": list(env.pip), "python": sys.version_info[:2], "machine": platform.machine()}
    if waived:
        key["waived"] = sorted(waived)
    text = json.dumps(key)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def env_folder(env: EnvSpec, cache_entry: str, waived: Sequence[str] = ()) -> Path:
    """Where `env` lives on this node: beside `cache_entry`, an entry of the export cache."""
    return Path(cache_entry).parent / ROOT / f"{env.tag.lstrip('_')[:80]}-{env_key(env, waived)}"


def ensure(env: EnvSpec, cache_entry: str, waived: Sequence[str] = ()) -> Built:
    """`env` made on this node, or found made: its site folder, how long this took, whether it
    was made now, and the versions it holds. Raises EnvError naming the pins and why.
    `waived`: distributions a pinned library requires that are left out on purpose (a format's
    own environment names them with its reason: tasks/export/openvino_ir.py); env.pip waives none."""
    start = time.perf_counter()
    folder = env_folder(env, cache_entry, waived)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per node; the others reuse what it made
        ready = folder / READY
        made = not ready.is_file()
        if made:
            _build(env, folder, waived)
        versions = json.loads(ready.read_text())["versions"]
    return Built(str(folder / "site"), time.perf_counter() - start, made, versions)


def _build(env: EnvSpec, folder: Path, waived: Sequence[str] = ()) -> None:
    """pip installs the pins alone (wheels only, no dependencies: those are the driver's), their
    requirements are checked against what the processes will import, then READY seals it."""
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    site = tmp / "site"
    command = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--target", str(site),
        "--disable-pip-version-check", "--no-input", "--quiet", *env.pip,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EnvError(f"env.pip={list(env.pip)}: pip install did not finish in {INSTALL_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise EnvError(f"env.pip={list(env.pip)}: pip install failed: {why[-1] if why else done.returncode}")
    versions = {dist_name(d.metadata["Name"]): d.version for d in metadata.distributions(path=[str(site)])}
    if problems := unmet(site, waived):
        shutil.rmtree(tmp, ignore_errors=True)
        raise EnvError(f"env.pip={list(env.pip)} does not work with this environment: {'; '.join(problems)}")
    (tmp / READY).write_text(json.dumps({"pip": list(env.pip), "versions": versions, "python": sys.version}))
    os.replace(tmp, folder)


def unmet(site: Path, waived: Sequence[str] = ()) -> list[str]:
    """Each requirement of the libraries in `site` that what the import path finds (`site`
    first, then this process's) does not meet: pip check's answer for an overlay. A requirement
    on a distribution in `waived` is met by its absence (not by a wrong version)."""
    # lazy: packaging, only where an environment is built; every benchmark's process imports this module
    from packaging.requirements import InvalidRequirement, Requirement

    path = [str(site), *sys.path]
    problems = []
    for dist in metadata.distributions(path=[str(site)]):
        for line in dist.requires or ():
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra's, or another platform's
            found = next(iter(metadata.distributions(name=req.name, path=path)), None)
            if found is None and dist_name(req.name) in waived:
                continue
            if found is None:
                problems.append(f"{dist.metadata['Name']} {dist.version} needs {req}, which is not installed")
            elif not req.specifier.contains(found.version, prereleases=True):
                problems.append(f"{dist.metadata['Name']} {dist.version} needs {req}, this environment has {found.version}")
    return problems
