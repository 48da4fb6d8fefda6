"""PyTorch eager: the prefill/decode graph modules run directly."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.contract import Refusal, Runtime
from tasks.measure.profiles import CALLS, WARMUP, add, top_ops
from tasks.model import quant  # quant.quantize looked up when called: a test may stand in for it
from tasks.model.models import build_model
from tasks.model.tensors import to_torch
from tasks.phases import phase_module
from tasks.runtimes._torch_session import TorchOutputSession
from tasks.specs import BenchSpec

if TYPE_CHECKING:
    import torch

_CPU_ONLY = "ExecuTorch's llama::update_cache / custom_sdpa have CPU kernels only"


def _nothing() -> None:
    """sync() on the CPU: torch's CPU calls return with their work done."""


class TorchSession(TorchOutputSession):
    def __init__(self, module: torch.nn.Module, spec: BenchSpec, meta: dict[str, Any]):
        # lazy: torch, only in a job's process
        import torch

        self.device = torch.device(spec.device)
        self.module = module.to(self.device)
        self.output_names = meta["output_names"]
        self.dtypes: dict[str, str] = meta.get("input_dtypes", {})
        self.info = {"torch_threads": torch.get_num_threads()}
        self.metrics: dict[str, float] = {}
        if self.device.type != "cuda":
            self.sync = _nothing  # the host clock calls it after every timed call: no branch there

    def place(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """Device copies made in inference mode, as the outputs fed back are (torch.compile
        guards on the difference)."""
        # lazy: torch, only in a job's process
        import torch

        with torch.inference_mode():
            return {n: to_torch(a, self.dtypes.get(n)).to(self.device, copy=True) for n, a in arrays.items()}

    def step(self, inputs: dict[str, Any]) -> list[Any]:
        # lazy: torch, only in a job's process
        import torch

        with torch.inference_mode():
            return list(self.module(*inputs.values()))

    def bind(self, feeds: dict[str, np.ndarray]):
        """The module on its placed inputs, as a functools.partial (no frame of ours per call);
        timed inside timed_region(), in inference mode."""
        return partial(self.module, *self.place(self.prepare(feeds)).values())

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """ATen ops by self time under torch.profiler; the harness calls it inside timed_region()."""
        return profile_rows(self.bind(feeds), self.sync, self.device.type == "cuda", calls)

    @contextmanager
    def timed_region(self) -> Iterator[None]:
        """Inference mode, entered once around the timed calls rather than in each."""
        # lazy: torch, only in a job's process
        import torch

        with torch.inference_mode():
            yield

    def sync(self) -> None:
        # lazy: torch, only in a job's process
        import torch

        torch.cuda.synchronize(self.device)

    def timer(self):
        """On CUDA, CUDA events (device time); on the CPU, None: the host clock."""
        # lazy: torch, only in a job's process
        import torch

        if self.device.type != "cuda":
            return None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.reset_peak_memory_stats(self.device)

        def timed(step) -> int:
            start.record()
            step()
            end.record()
            end.synchronize()
            return int(start.elapsed_time(end) * 1e6)  # ms -> ns

        return timed

    def device_metrics(self) -> dict[str, float]:
        # lazy: torch, only in a job's process
        import torch

        if self.device.type != "cuda":
            return {}
        return {"cuda_peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}


def profile_rows(call: Callable[[], object], sync: Callable[[], None], cuda: bool, calls: int = CALLS):
    """Each op's self time under torch.profiler (the device's on CUDA); the call's whole time
    from the host clock."""
    # lazy: torch, only in a job's process
    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARMUP):
        call()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        call_us = (time.perf_counter() - t0) * 1e6
    per_op: dict[str, tuple[int, float]] = {}
    for evt in prof.key_averages():
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        if us > 0 and not evt.key.startswith("ProfilerStep"):
            add(per_op, evt.key, float(us), int(evt.count))
    return top_ops(per_op, calls, call_us)


def set_threads(spec: BenchSpec) -> None:
    # lazy: torch, only in a job's process
    import torch

    if spec.bench.threads:
        torch.set_num_threads(spec.bench.threads)


def build_module(spec: BenchSpec) -> torch.nn.Module:
    """The same graph module the exporters see, built from the spec."""

    m = spec.model
    graph = phase_module(spec.phase.name).build_graph(build_model(m), spec.phase, m.family, m.kv_cache, m.attention)
    quant.quantize(graph, m.quant, m.quant_group)  # model.quant: torchao's tensor subclasses run under torch and inductor
    return graph


class EagerRuntime(Runtime):
    """The graph module itself, in PyTorch (format `none`); it quantises what it builds."""

    LIBRARIES = ("torch", "transformers", "torchao")  # torchao: model.quant
    PRELOAD = ("torch", "transformers")  # what load() imports, with the plan's families' modelling modules
    MODELS = True
    PROFILER = "torch.profiler, ops by self time, after the timed loop in the same session"
    REFUSALS = (
        Refusal("model.kv_cache", "update_cache", _CPU_ONLY, devices=("cuda",)),
        Refusal("model.attention", "custom_sdpa", _CPU_ONLY, devices=("cuda",)),
    )
    QUANTS = {"cpu": ("none", "int8", "int4", "8da4w"), "cuda": ("none",)}  # tasks/model/quant.py, in every dtype
    QUANT_NOTE = {"cuda": "torchao's CUDA paths (int4 tile-packed: bfloat16 only) have not run on a GPU here; see docs/gpu.md"}

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
        set_threads(spec)
        return TorchSession(build_module(spec), spec, meta)


RUNTIME = EagerRuntime()
