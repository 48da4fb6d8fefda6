"""PyTorch eager: the prefill/decode graph modules run directly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.model.families import FAMILIES
from tasks.specs import BenchSpec

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "transformers")
# what a fork server imports for its benchmarks (tasks/worker/forks.py): what load() would import
PRELOAD = ("torch", "transformers", *dict.fromkeys(f.rotary_module for f in FAMILIES.values()))
MEMORY_FACTOR = 1.5
# model dtypes it runs, by device: other combinations are skipped at plan time
DTYPES = {"cpu": ("float32", "float16", "bfloat16"), "cuda": ("float32", "float16", "bfloat16")}
PROFILER = "torch.profiler, ops by self time, after the timed loop in the same session"


@dataclass(frozen=True)
class Options:
    pass


def _nothing() -> None:
    """sync() on the CPU: torch's CPU calls return with their work done."""


class TorchSession:
    def __init__(self, module: torch.nn.Module, spec: BenchSpec, meta: dict[str, Any]):
        import torch

        self.device = torch.device(spec.device)
        self.module = module.to(self.device)
        self.output_names = meta["output_names"]
        self.dtypes: dict[str, str] = meta.get("input_dtypes", {})
        self.info = {"torch_threads": torch.get_num_threads()}
        self.metrics: dict[str, float] = {}
        if self.device.type != "cuda":
            self.sync = _nothing  # the host clock calls it after every timed call: no test, no branch

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list[torch.Tensor]:
        """Device copies made in inference mode, like the outputs fed back in run_steps
        (torch.compile guards on the difference and would recompile)."""
        import torch

        from tasks.model.tensors import to_torch

        with torch.inference_mode():
            return [to_torch(a, self.dtypes.get(n)).to(self.device, copy=True) for n, a in feeds.items()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Logits in float32; caches in their own dtype (bfloat16 as uint16 bits)."""
        import torch

        from tasks.model.tensors import logits_numpy, to_numpy

        with torch.inference_mode():
            logits, *rest = self.module(*self._tensors(feeds))
            return [logits_numpy(logits), *map(to_numpy, rest)]

    def run_steps(self, feeds: dict[str, np.ndarray], tokens: np.ndarray, start: int) -> list[np.ndarray]:
        """Consecutive decode steps, each fed the previous step's present cache as the
        tensors it returned (on the device, in the model's dtype). Logits [B, 1, V] each."""
        import torch

        from tasks.model.tensors import logits_numpy

        _ids, _pos, *past = self._tensors(feeds)
        out = []
        with torch.inference_mode():
            for t in range(tokens.shape[1]):
                ids = torch.from_numpy(tokens[:, t : t + 1].copy()).to(self.device)  # fresh standard strides
                pos = torch.tensor([start + t], dtype=torch.int64, device=self.device)
                logits, *past = self.module(ids, pos, *past)
                out.append(logits_numpy(logits))
        return out

    def bind(self, feeds: dict[str, np.ndarray]):
        """The module on its inputs placed once, as a functools.partial (no frame of ours
        per call). It runs in inference mode inside timed_region(), where the harness makes
        every timed call; outside it, it would run with autograd on (and a compiled module
        would recompile for the grad mode)."""
        return partial(self.module, *self._tensors(feeds))

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """ATen ops by self time under torch.profiler; the harness calls it inside timed_region()."""
        from tasks.measure.profiles import torch_rows

        return torch_rows(self.bind(feeds), self.sync, self.device.type == "cuda", calls)

    @contextmanager
    def timed_region(self) -> Iterator[None]:
        """Around the timed calls (the first call, and measure()'s whole loop): inference
        mode, entered once here instead of around every call."""
        import torch

        with torch.inference_mode():
            yield

    def sync(self) -> None:
        """On CUDA, wait for the device (on the CPU __init__ replaces it by a no-op)."""
        import torch

        torch.cuda.synchronize(self.device)

    def timer(self):
        """On CUDA, time each call with CUDA events (device time, synchronised on the end
        event); on CPU, None: the harness's host clock."""
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
        import torch

        if self.device.type != "cuda":
            return {}
        return {"cuda_peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}


def set_threads(spec: BenchSpec) -> None:
    import torch

    if spec.bench.threads:
        torch.set_num_threads(spec.bench.threads)


def build_module(spec: BenchSpec) -> torch.nn.Module:
    """The same graph module the exporters see, built from the spec."""
    from tasks.model.models import build_model
    from tasks.phases import phase_module

    model = build_model(spec.model)
    m = spec.model
    return phase_module(spec.phase.name).build_graph(model, spec.phase, m.family, m.kv_cache, m.attention)


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    set_threads(spec)
    return TorchSession(build_module(spec), spec, meta)
