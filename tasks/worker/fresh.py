"""fn(spec) in a process of its own, in which nothing ran before it: forked by a node's fork
server (tasks/worker/forks.py) when one listens, else spawned. Its timeout counts from the
child's start, and a crash (segfault, os._exit, the OOM killer) is a failed result."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tasks.measure.machine import die_with_parent
from tasks.specs import (
    AppLoopResult,
    AppLoopSpec,
    BenchResult,
    CaptureResult,
    CaptureSpec,
    ExportResult,
    ExportSpec,
    Failure,
)
from tasks.worker import forks as fork_server


@contextmanager
def importing_from(paths: Sequence[str]) -> Iterator[None]:
    """`paths` first on this process's import path while inside: a process spawned meanwhile
    starts with it (multiprocessing's spawn copies sys.path), so it imports their modules."""
    saved = list(sys.path)
    sys.path[:0] = list(paths)
    try:
        yield
    finally:
        sys.path[:] = saved


def in_fresh_process(
    fn: Callable[[Any], Any], spec: Any, timeout_s: float | None, stage: str, forks: str | None = None,
    paths: Sequence[str] = (),
) -> Any:
    """`forks`: the folder of the fork server to fork from; None, or none listening: spawned.
    `paths`: folders first on the child's import path from its start (it is spawned then: a
    fork server's modules are already imported)."""
    if forks is not None and not paths:
        try:
            conn = fork_server.connect(forks)
        except (fork_server.ForkServerError, OSError) as e:
            logging.getLogger(__name__).warning("%s; spawning the %s process instead", e, stage)
        else:
            kind, value = fork_server.run(conn, fn, spec, timeout_s)
            return _ended(spec, stage, timeout_s, kind, value)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(send, fn, spec), name=f"phasesweep-{stage}")
    with importing_from(paths):
        child.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            child.kill()
            return _ended(spec, stage, timeout_s, "timeout", None)
        try:
            return receive.recv()
        except EOFError:
            child.join(5)
            return _ended(spec, stage, timeout_s, "died", child.exitcode)
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receive.close()


def _child_main(conn: Any, fn: Callable[[Any], Any], spec: Any) -> None:
    die_with_parent()
    conn.send(fn(spec))  # the jobs return failures as results; they do not raise
    conn.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode} before returning a result"


def _ended(spec: Any, stage: str, timeout_s: float | None, kind: str, value: Any) -> Any:
    """The child's result, or the failure that says how it ended without one."""
    if kind == "result":
        return value
    if kind == "timeout":
        return failed(spec, Failure(stage, f"timed out after {timeout_s:g}s of its own run (cluster.task_timeout_s)"))
    if kind == "lost":
        return failed(spec, Failure(stage, f"the fork server of the {stage} process ended before its result came"))
    return failed(spec, Failure(stage, f"the {stage} process died: {_death(value)}"))


def failed(spec: Any, failure: Failure) -> ExportResult | BenchResult | CaptureResult | AppLoopResult:
    if isinstance(spec, ExportSpec):
        return ExportResult(key=spec.key, out_dir=spec.out_dir, ok=False, failure=failure)
    if isinstance(spec, CaptureSpec):
        return CaptureResult(key=spec.key, ok=False, failure=failure)
    if isinstance(spec, AppLoopSpec):
        return AppLoopResult(key=spec.key, ok=False, failure=failure)
    return BenchResult(spec.variant, ok=False, failure=failure)
