"""The torch sessions' timed path (eager and compile): the bound call is a bare partial of
the module, inference mode is entered once by timed_region(), sync is a no-op on the CPU,
and a torch.compile recompile inside timed_region() fails. On a two-op module compiled with
Dynamo's eager backend: seconds, no export, no inductor."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tasks.specs import BenchSpec
from tests.conftest import DECODE, model_spec

torch = pytest.importorskip("torch")

META = {"output_names": ["sum", "product"], "input_dtypes": {}}
FEEDS = {"x": np.ones((2, 3), np.float32), "y": np.full((2, 3), 2, np.float32)}


def spec(runtime: str) -> BenchSpec:
    return BenchSpec(f"test_{runtime}", runtime, "cpu", model_spec("llama"), DECODE, export_dir="unused")


def two_ops() -> torch.nn.Module:
    class TwoOps(torch.nn.Module):  # a class per call: Dynamo's cache is per code object
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))  # requires grad: outside inference mode it would record

        def forward(self, x, y):
            return x * self.w + y, x * y

    return TwoOps()


def test_eager_bind_is_a_partial_run_in_inference_mode_inside_timed_region():
    from tasks.measure.bench import wall_clock
    from tasks.runtimes.eager import TorchSession

    session = TorchSession(two_ops(), spec("eager"), META)
    call = session.bind(FEEDS)
    assert isinstance(call, functools.partial) and call.func is session.module
    assert session.sync() is None and session.timer() is None
    with session.timed_region():
        assert torch.is_inference_mode_enabled()
        out, _ = call()
        assert wall_clock(session.sync)(call) > 0
    assert not torch.is_inference_mode_enabled()
    assert out.is_inference() and torch.equal(out, torch.full((2, 3), 3.0))


def compiled_session():
    from tasks.runtimes.compile import CompiledSession, _compile_counts

    module = torch.compile(two_ops(), backend="eager", fullgraph=True, dynamic=False)
    session = CompiledSession(module, spec("compile"), META)
    session.run(FEEDS)  # compiles, as load() does: inference mode, the same tensors
    session.compiled_after_load = _compile_counts()[0]
    return session


def test_compile_timed_region_runs_the_loaded_graph_without_recompiling():
    from tasks.measure.bench import measure
    from tasks.runtimes.compile import _compile_counts
    from tasks.specs import BenchOptions

    session = compiled_session()
    before = _compile_counts()
    call = session.bind(FEEDS)
    opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0.0, min_iters=20, max_iters=20, min_seconds=0.0)
    with session.timed_region():
        call()  # the first call, as bench_job times it
        m = measure(call, opts, session.sync, session.timer())
    assert len(m.samples_ns) == 20 and _compile_counts() == before and session.recompiles() == 0


def test_compile_recompile_inside_timed_region_fails():
    session = compiled_session()
    bigger = {k: np.ones((4, 3), np.float32) for k in FEEDS}
    call, other = session.bind(FEEDS), session.bind(bigger)
    with pytest.raises(RuntimeError, match="recompiled inside the timed region"), session.timed_region():
        call()
        other()  # a new static shape: Dynamo compiles a second graph
    assert session.recompiles() == 1


def test_dynamos_counters_are_where_compile_reads_them():
    """torch._dynamo.utils.counters is private: an upgrade that moves it fails here, not silently."""
    import warnings

    from tasks.runtimes import compile as compile_runtime

    compile_runtime.dynamo_counters.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_runtime.dynamo_counters() is not None


def test_without_the_counters_a_recompile_still_fails_the_timed_region(monkeypatch):
    """The fallback: the public fail_on_recompile stance; recompiles go unreported, not zero."""
    from tasks.runtimes import compile as compile_runtime

    session = compiled_session()
    monkeypatch.setattr(compile_runtime, "dynamo_counters", lambda: None)
    bigger = {k: np.ones((5, 3), np.float32) for k in FEEDS}
    call, other = session.bind(FEEDS), session.bind(bigger)
    with pytest.raises(Exception, match="(?i)recompil"), session.timed_region():
        call()
        other()
    assert session.recompiles() is None
