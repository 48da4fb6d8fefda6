"""tasks/worker/heap.py: in phasesweep's own processes, the cyclic collector off while they import
and what the imports made frozen after; at exit, no last walk of the heap. A process that
only calls into phasesweep (this one) keeps its collector as it is."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from tasks.worker import heap
from tasks.worker.heap import imports_uncollected
from tests.conftest import ROOT


@pytest.fixture
def managed(monkeypatch):
    """This process as if it were phasesweep's own; whatever a test froze is thawed after."""
    monkeypatch.setattr(heap, "_managed", True)
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def test_imports_run_uncollected_and_what_they_made_is_frozen(managed):
    kept = []
    with imports_uncollected():
        assert not gc.isenabled()
        kept.extend([i] for i in range(1000))  # objects the collector tracks, as an import's are
    assert gc.isenabled()
    assert gc.get_freeze_count() >= 1000  # frozen: no later collection walks them


def test_overlapping_blocks_keep_the_collector_off_until_the_last_ends(managed):
    outer = imports_uncollected()
    outer.__enter__()  # one thread's block (MLflow's import) ...
    with imports_uncollected():  # ... and another's (Ray's start), ending first
        pass
    assert not gc.isenabled() and gc.get_freeze_count() == 0
    outer.__exit__(None, None, None)
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_the_collector_is_left_as_it_was_even_when_the_block_raises(managed):
    gc.disable()
    with imports_uncollected():
        pass
    assert not gc.isenabled()  # it was off: it stays off
    gc.enable()
    with pytest.raises(RuntimeError), imports_uncollected():
        raise RuntimeError("an import failed")
    assert gc.isenabled()


def test_a_process_that_only_calls_phasesweep_keeps_its_collector():
    assert not heap._managed  # pytest's process: sweep_app keeps sweep.py from managing it
    gc.unfreeze()  # tests/conftest.py froze collection's imports (and freezes them again after)
    with imports_uncollected():
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def ends_with(*code: str) -> str:
    """What a Python process prints when it runs `code` and exits: a cycle with a finalizer
    (collected only by the interpreter's last collection) says so in its __del__."""
    program = "\n".join(
        [
            "import sys",
            f"sys.path.insert(0, {str(ROOT)!r})",
            *code,
            "class Cycle:",
            "    def __del__(self):",
            "        print('collected at exit', flush=True)",
            "c = Cycle(); c.me = c; del c",
            "print('done', flush=True)",
        ]
    )
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True).stdout


def test_a_managed_process_skips_the_heap_walk_at_exit():
    gc_at_exit = ends_with("import gc; gc.disable()")  # the cycle outlives every collection but the last
    assert gc_at_exit.split() == ["done", "collected", "at", "exit"]
    skipped = ends_with("import gc; gc.disable()", "from tasks.worker.heap import manage_process", "manage_process()")
    assert skipped.split() == ["done"]  # frozen after the exit handlers: never walked, never finalized


def ends(*code: str) -> subprocess.CompletedProcess:
    """A managed Python process that runs `code` holding, in a module of its own, an object whose
    __del__ (run when the interpreter's teardown clears the modules) and an exit handler each
    print a line."""
    program = "\n".join(
        [
            "import atexit, os, sys, types",
            f"sys.path.insert(0, {str(ROOT)!r})",
            "from tasks.worker.heap import ending, manage_process",
            "manage_process()",
            "class Held:",
            "    def __del__(self):",
            "        os.write(1, b'torn down\\n')",
            "sys.modules['held'] = types.ModuleType('held')",
            "sys.modules['held'].it = Held()",
            "atexit.register(lambda: print('exit handler', flush=True))",
            *code,
        ]
    )
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)


def test_a_process_that_said_its_work_is_done_runs_its_exit_handlers_and_skips_the_teardown():
    plain = ends("sys.exit(3)")
    assert (plain.returncode, plain.stdout.split("\n")[:2]) == (3, ["exit handler", "torn down"])
    done = ends("print('work', end='')", "ending(3)", "sys.exit(3)")
    assert (done.returncode, done.stdout) == (3, "workexit handler\n")  # flushed, handled, not torn down
    said = ends("ending('phasesweep: 1 variant(s) failed: a')", "sys.exit('phasesweep: 1 variant(s) failed: a')")
    assert (said.returncode, said.stderr, said.stdout) == (1, "phasesweep: 1 variant(s) failed: a\n", "exit handler\n")
    ok = ends("ending(None)")
    assert (ok.returncode, ok.stdout) == (0, "exit handler\n")
