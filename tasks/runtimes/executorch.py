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
PRELOAD = ("executorch.runtime", "executorch.extension.pybindings.portable_lib")
MEMORY_FACTOR = 1.5
# model dtypes it runs, by device: other combinations are skipped at plan time
DTYPES = {"cpu": ("float32", "float16", "bfloat16")}
PROFILER = "ExecuTorch's ETDump, read with its Inspector, from a program loaded with it on"


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
        self.path = path
        self.program = Runtime.get().load_program(path)
        self.method = self.program.load_method("forward")
        self.output_names = meta["output_names"]
        self.dtypes: dict[str, str] = meta.get("input_dtypes", {})
        self.info = {"xnnpack_threads": portable_lib._threadpool_get_thread_count()}
        self.metrics: dict[str, float] = {}

    def _tensors(self, feeds: dict[str, np.ndarray]) -> list:
        from tasks.model.tensors import to_torch

        return [to_torch(a, self.dtypes.get(n)) for n, a in feeds.items()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Logits in float32; caches in their own dtype (bfloat16 as uint16 bits); copies
        out of the method's memory."""
        from tasks.model.tensors import logits_numpy, to_numpy

        logits, *rest = self.method.execute(self._tensors(feeds))
        return [logits_numpy(logits), *(to_numpy(t.clone()) for t in rest)]

    def run_steps(self, feeds: dict[str, np.ndarray], tokens: np.ndarray, start: int) -> list[np.ndarray]:
        """Consecutive decode steps, each fed the previous step's present cache as tensors
        in the model's dtype (copied out of the method's memory, which the next call reuses)."""
        import torch

        from tasks.model.tensors import logits_numpy

        _ids, _pos, *past = self._tensors(feeds)
        out = []
        for t in range(tokens.shape[1]):
            ids = torch.from_numpy(tokens[:, t : t + 1].copy())
            pos = torch.tensor([start + t], dtype=torch.int64)
            logits, *present = self.method.execute([ids, pos, *past])
            out.append(logits_numpy(logits))
            past = [p.clone() for p in present]
        return out

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """Kernels (portable) and XNNPACK operators, from an ETDump of a second load of the
        program with event tracing on (the timed program never traces)."""
        import warnings

        from executorch.devtools import Inspector
        from executorch.devtools.inspector import TimeScale
        from executorch.runtime import Runtime

        from tasks.measure.profiles import WARMUP, executorch_rows

        program = Runtime.get().load_program(self.path, enable_etdump=True, debug_buffer_size=0)
        method = program.load_method("forward")
        inputs = self._tensors(feeds)
        for _ in range(WARMUP + calls):
            method.execute(inputs)
        etdump, debug = folder / "etdump.etdp", folder / "debug.bin"
        program.write_etdump_result_to_file(str(etdump), str(debug))
        with warnings.catch_warnings():  # no debug buffer was asked for: timings only
            warnings.filterwarnings("ignore", message="Output Buffer not found")
            inspector = Inspector(etdump_path=str(etdump), target_time_scale=TimeScale.US)
        events = [
            (event.name, list(event.perf_data.raw))
            for block in inspector.event_blocks
            if block.name == "Execute"
            for event in block.events
            if event.perf_data is not None
        ]
        return executorch_rows(events, WARMUP)

    def bind(self, feeds: dict[str, np.ndarray]):
        inputs = self._tensors(feeds)
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
