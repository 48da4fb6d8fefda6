"""ExecuTorch: the .pte runs in the ExecuTorch runtime (XNNPACK delegate) from Python.

`import executorch.runtime` costs seconds: it happens inside the session, on the worker
that benchmarks an executorch variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.specs import BenchSpec

LIBRARIES = ("executorch",)
MEMORY_FACTOR = 1.5


@dataclass(frozen=True)
class Options:
    pass


class PteSession:
    def __init__(self, path: Path, spec: BenchSpec, meta: dict[str, Any]):
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        if spec.device != "cpu":
            raise RuntimeError(f"device={spec.device}: the executorch backend runs on cpu only")
        if spec.bench.threads:
            portable_lib._unsafe_reset_threadpool(spec.bench.threads)  # XNNPACK's thread pool
        self.program = Runtime.get().load_program(path)
        self.method = self.program.load_method("forward")
        self.output_names = meta["output_names"]
        self.info = {"xnnpack_threads": portable_lib._threadpool_get_thread_count()}
        self.metrics: dict[str, float] = {}

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        outputs = self.method.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in feeds.values()])
        return [o.detach().clone().float().numpy() for o in outputs]  # copy out of the method's memory

    def bind(self, feeds: dict[str, np.ndarray]):
        import torch

        inputs = [torch.from_numpy(np.ascontiguousarray(a)) for a in feeds.values()]
        method = self.method
        return lambda: method.execute(inputs)

    def sync(self) -> None:
        pass

    def timer(self):
        return None

    def device_metrics(self) -> dict[str, float]:
        return {}


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> PteSession:
    return PteSession(Path(spec.export_dir) / meta["artifact"], spec, meta)
