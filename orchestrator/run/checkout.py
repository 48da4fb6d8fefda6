"""The commits of a repository under test, each checked out in a git worktree of its own
(orchestrator.bisect): never the user's checkout, and removed afterwards."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tasks.specs import ConfigError


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]


def git(repo: Path, *args: str) -> str:
    """git's stdout; its error as a ConfigError naming the command."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} in {repo}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def resolve(repo: Path, rev: str, flag: str) -> Commit:
    """The commit `rev` names in `repo` (flag: the option that gave it, for the error)."""
    try:
        sha = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except ConfigError:
        raise ConfigError(f"{flag}={rev!r} names no commit of {repo}") from None
    return Commit(sha, git(repo, "log", "-1", "--format=%s", sha).strip())


def between(repo: Path, good: Commit, bad: Commit) -> list[Commit]:
    """The commits after `good` up to `bad` inclusive, oldest first, on the ancestry path
    (what git bisect searches when the history is linear)."""
    lines = git(repo, "log", "--reverse", "--ancestry-path", "--first-parent", "--format=%H %s", f"{good.sha}..{bad.sha}")
    return [Commit(*line.split(" ", 1)) if " " in line else Commit(line, "") for line in lines.splitlines()]


def check_order(repo: Path, good: Commit, bad: Commit) -> None:
    done = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good.sha, bad.sha])
    if done.returncode != 0 or good.sha == bad.sha:
        raise ConfigError(f"--good {good.short} must be an ancestor of --bad {bad.short} (and differ from it) in {repo}")


def tree_id(repo: Path, commit: Commit, paths: tuple[str, ...]) -> str:
    """One id of what `paths` hold at `commit`: equal across commits that leave them alone."""
    ids = [git(repo, "rev-parse", f"{commit.sha}:{p}" if p not in ("", ".") else f"{commit.sha}^{{tree}}").strip() for p in paths]
    return "-".join(i[:12] for i in ids)


def root_of(path: Path) -> Path:
    """The top of the git repository `path` lies in."""
    return Path(git(path, "rev-parse", "--show-toplevel").strip())


@contextmanager
def worktree(repo: Path, commit: Commit, parent: Path) -> Iterator[Path]:
    """`commit` checked out (detached) in a new worktree under `parent`; removed on exit."""
    where = parent / commit.short
    git(repo, "worktree", "add", "--detach", "--force", str(where), commit.sha)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)
