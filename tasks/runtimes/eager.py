"""PyTorch eager: the prefill/decode graph modules run directly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.specs import BenchSpec

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "transformers")
MEMORY_FACTOR = 1.5


@dataclass(frozen=True)
class Options:
    pass


class TorchSession:
    def __init__(self, module: torch.nn.Module, spec: BenchSpec, meta: dict[str, Any]):
        import torch

        self.device = torch.device(spec.device)
        self.module = module.to(self.device)
        self.output_names = meta["output_names"]
        self.info = {"torch_threads": torch.get_num_threads()}
        self.metrics: dict[str, float] = {}

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list[torch.Tensor]:
        import torch

        return [torch.from_numpy(a).to(self.device) for a in feeds.values()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            return [t.float().cpu().numpy() for t in self.module(*self._tensors(feeds))]

    def bind(self, feeds: dict[str, np.ndarray]):
        import torch

        args = self._tensors(feeds)
        module = self.module

        def call():
            with torch.inference_mode():
                return module(*args)

        return call

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
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
    from tasks.models import build_model
    from tasks.phases import phase_module

    model = build_model(spec.model)
    m = spec.model
    return phase_module(spec.phase.name).build_graph(model, m.family, m.kv_cache, m.attention)


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    set_threads(spec)
    return TorchSession(build_module(spec), spec, meta)
