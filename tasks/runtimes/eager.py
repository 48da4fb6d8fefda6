"""PyTorch eager: the prefill/decode graph modules run directly."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tasks.graphs import build_graph
from tasks.models import build_model
from tasks.specs import BenchSpec


class TorchSession:
    def __init__(self, module: torch.nn.Module, spec: BenchSpec, meta: dict[str, Any]):
        self.device = torch.device(spec.device)
        self.module = module.to(self.device)
        self.output_names = meta["output_names"]
        self.info = {"torch_threads": torch.get_num_threads()}
        self.metrics: dict[str, float] = {}

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list[torch.Tensor]:
        return [torch.from_numpy(a).to(self.device) for a in feeds.values()]

    @torch.inference_mode()
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [t.float().cpu().numpy() for t in self.module(*self._tensors(feeds))]

    def bind(self, feeds: dict[str, np.ndarray]):
        args = self._tensors(feeds)
        module = self.module

        def call():
            with torch.inference_mode():
                return module(*args)

        return call

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timer(self):
        """On CUDA, time each call with CUDA events (device time, synchronised on the end
        event); on CPU, None: the harness's host clock."""
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
        if self.device.type != "cuda":
            return {}
        return {"cuda_peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}


def set_threads(spec: BenchSpec) -> None:
    if spec.bench.threads:
        torch.set_num_threads(spec.bench.threads)


def build_module(spec: BenchSpec) -> torch.nn.Module:
    model = build_model(spec.model)
    return build_graph(model, spec.phase.name, spec.model.kv_cache, spec.model.attention)


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> TorchSession:
    set_threads(spec)
    return TorchSession(build_module(spec), spec, meta)
