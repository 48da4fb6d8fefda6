"""ExecuTorch (.pte, XNNPACK) and torch.compile backends: parity one step and many,
delegation report, compile time apart from steady-state latency.

Exports come from the session's shared cache (conftest `planned_variant`): the .pte of
llama decode is the one test_end_to_end.py's in-process sweep made, if it ran first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tasks.jobs import bench_job
from tests.conftest import DECODE, ROOT

pytestmark = pytest.mark.slow


EXECUTORCH = [
    ("llama", "prefill", "static"),
    ("llama", "decode", "static"),
    ("phi3", "decode", "static"),
    ("llama", "decode", "dynamic"),  # the cache grows by one position a step: dynamic shapes in the .pte
]
NO_DELEGATE = "backend.export_options.delegate=none"


def job(model, phase, backend, kv_cache="static", *more) -> list[str]:
    return [f"model={model}", f"phase={phase}", f"backend={backend}", f"model.kv_cache={kv_cache}", *more]


@pytest.fixture(scope="module", autouse=True)
def exports_in_background(planned_variant, request):
    """The .pte files the selected tests of this module need, two at a time (an ExecuTorch
    export takes tens of seconds): each test then waits for its own."""
    jobs = []
    for item in request.session.items:
        if item.module is not request.module:
            continue
        if item.originalname == "test_executorch_parity_and_delegation":
            p = item.callspec.params
            jobs.append(job(p["model"], p["phase"], "executorch", p["kv_cache"]))
        elif item.originalname == "test_executorch_without_delegate_runs_portable_kernels":
            jobs.append(job("llama", "decode", "executorch", "static", NO_DELEGATE))
    planned_variant.prefetch(*jobs)


def bench(planned_variant, model, phase, backend, kv_cache="static", *more):
    export, spec = planned_variant(*job(model, phase, backend, kv_cache, *more))
    result = bench_job(spec)
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)
    return export, result


@pytest.mark.parametrize("model,phase,kv_cache", EXECUTORCH)
def test_executorch_parity_and_delegation(planned_variant, model, phase, kv_cache):
    export, result = bench(planned_variant, model, phase, "executorch", kv_cache)
    assert Path(export.artifact).suffix == ".pte" and export.artifact_mb > 0
    d = export.details
    assert d["delegate"] == "xnnpack"
    assert d["delegated_ops"] > 0 and d["delegated_ops"] + d["non_delegated_ops"] > d["delegated_ops"]
    assert 0 < d["delegated_fraction"] < 1
    assert result.parity["passed"] and result.parity["steps"] == (DECODE.parity_steps if phase == "decode" else 1)
    assert result.params["xnnpack_threads"] == 1


def test_executorch_without_delegate_runs_portable_kernels(planned_variant):
    export, result = bench(planned_variant, "llama", "decode", "executorch", "static", NO_DELEGATE)
    assert export.details["delegate"] == "none" and export.details["delegated_ops"] == 0
    assert result.parity["passed"]


def test_compile_reports_compile_time_apart_from_latency(planned_variant):
    """Prefill, compiled cold (backend.options.cold_cache=true, the default). Decode on a
    growing cache, inductor's caches on, goes through the whole path in test_end_to_end.py."""
    _, result = bench(planned_variant, "llama", "prefill", "compile")
    m = result.metrics
    assert result.parity["passed"] and result.parity["steps"] == 1
    # compiling takes seconds; a steady-state call of the tiny model takes well under one
    assert m["compile_seconds"] > 1.0 and m["latency_ms_median"] < 1000 * m["compile_seconds"]
    assert result.params["compile_cold_cache"] is True and result.params["compile_mode"] == "default"
    assert max(result.samples_ns) / 1e9 < m["compile_seconds"]  # no sample contains the compile


def test_executorch_on_cuda_is_a_clear_error(planned_variant):
    _, spec = planned_variant("model=llama", "phase=decode", "backend=executorch")
    result = bench_job(replace(spec, device="cuda"))  # the planner skips it; a hand-made spec must fail clearly
    assert not result.ok and result.failure.stage == "load"
    assert "device=cuda: the executorch backend runs on cpu only" in result.failure.error


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")  # a cold compile test before it in this process
def test_the_export_server_makes_xnnpacks_patterns_before_it_forks_and_stays_one_thread():
    """tasks/export/_xnnpack_patterns (in the ExecuTorch format's PRELOAD) fills XNNPACK's
    private pattern caches, so forked exports inherit them, and leaves the process as a fork
    server must be: its Python threads and torch's thread count as before."""
    import threading

    import torch

    from tasks.export import _xnnpack_patterns
    from tasks.export import executorch as executorch_format

    assert "tasks.export._xnnpack_patterns" in executorch_format.FORMAT.PRELOAD
    found = _xnnpack_patterns.caches()  # raises where an upgrade moved them
    for fn in found:
        fn.cache_clear()  # made anew here, whatever ran in this process before
    threads, torch_threads = set(threading.enumerate()), torch.get_num_threads()
    assert _xnnpack_patterns.make_patterns()
    assert [fn.cache_info().currsize for fn in found] == [1, 1]
    assert set(threading.enumerate()) <= threads, set(threading.enumerate()) - threads
    assert torch.get_num_threads() == torch_threads



def test_the_xnnpack_patterns_guard_warns_and_does_nothing_off_the_pin(monkeypatch):
    from tasks.export import _xnnpack_patterns as patterns

    assert f'"executorch=={patterns.PINNED}"' in (ROOT / "pyproject.toml").read_text()
    monkeypatch.setattr(patterns.metadata, "version", lambda name: "0.0")
    with pytest.warns(UserWarning, match="executorch 0.0 is not"):
        assert not patterns.make_patterns()
    monkeypatch.undo()
    monkeypatch.setattr(patterns, "CACHES", (("sdpa", "moved_away"),))
    with pytest.warns(UserWarning, match="moved_away"):
        assert not patterns.make_patterns()


def test_xnnpacks_thread_pool_is_reachable():
    """bench.threads sets XNNPACK's pool through private pybindings: an upgrade that drops them fails here."""
    from executorch.extension.pybindings import portable_lib

    from tasks.runtimes.executorch import threadpool

    assert callable(threadpool(portable_lib, "_unsafe_reset_threadpool"))
    assert threadpool(portable_lib, "_threadpool_get_thread_count")() >= 1
