"""ONNX Runtime: CPU execution provider, or CUDA when device=cuda. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.specs import PAST, BenchSpec, choice

LIBRARIES = ("onnxruntime",)
MEMORY_FACTOR = 1.5  # peak RSS 6.8 GB benchmarking the Llama-3.2-1B architecture in fp32 (1.4x)
# model dtypes it runs, by device: other combinations are skipped at plan time
DTYPES = {"cpu": ("float32", "float16"), "cuda": ("float32", "float16", "bfloat16")}
DTYPE_NOTE = "ONNX Runtime's CPU provider has no bfloat16 kernels (e.g. Mul)"
OPT_LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True)
class Options:
    graph_optimization_level: str = "all"  # ONNX Runtime's graph optimiser: disable | basic | extended | all

    def __post_init__(self) -> None:
        choice("backend.options.graph_optimization_level", self.graph_optimization_level, OPT_LEVELS)


PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


class OrtSession:
    def __init__(self, path: Path, spec: BenchSpec):
        import onnxruntime as ort

        options = Options(**spec.runtime_options)
        providers = PROVIDERS[spec.device]
        missing = [p for p in providers if p not in ort.get_available_providers()]
        if missing:
            raise RuntimeError(
                f"device={spec.device}: onnxruntime {ort.__version__} lacks {', '.join(missing)} "
                f"(available: {', '.join(ort.get_available_providers())})"
            )
        opts = ort.SessionOptions()
        opts.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[options.graph_optimization_level]
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if spec.bench.threads:
            opts.intra_op_num_threads = spec.bench.threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        self.device = "cuda" if spec.device == "cuda" else "cpu"
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.info = {
            "ort_intra_op_threads": spec.bench.threads or 0,  # 0: ONNX Runtime's default (all cores)
            "ort_inter_op_threads": 1,
            "ort_providers": ",".join(self.session.get_providers()),
            "ort_graph_optimization_level": options.graph_optimization_level,
        }
        self.metrics: dict[str, float] = {}
        self._binding = None

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, feeds)

    def bind(self, feeds: dict[str, np.ndarray]):
        """Inputs copied to the device once; outputs left to ONNX Runtime's allocator on the
        device. (Binding preallocated output OrtValues measured 18% slower on the tiny decode
        graph: ORT then copies each result into the caller's buffer.)"""
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name, arr in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, self.device, 0))
        for out in self.session.get_outputs():
            binding.bind_output(out.name, self.device)
        self._binding = binding
        session = self.session
        return lambda: session.run_with_iobinding(binding)

    def sync(self) -> None:
        if self._binding is not None and self.device == "cuda":
            self._binding.synchronize_outputs()

    def timer(self):
        return None  # host clock; sync() waits for the CUDA EP's outputs

    def device_metrics(self) -> dict[str, float]:
        return {}

    def run_steps(self, feeds: dict[str, np.ndarray], tokens: np.ndarray, start: int) -> list[np.ndarray]:
        """Consecutive decode steps, each fed the present cache of the step before as
        OrtValues that stay on the device: no cache tensor goes through numpy between steps.
        Returns each step's logits [B, 1, V]."""
        import onnxruntime as ort

        binding = self.session.io_binding()
        past = [n for n in feeds if n.startswith(PAST)]
        for name in past:
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(feeds[name], self.device, 0))
        logits = []
        for t in range(tokens.shape[1]):
            binding.bind_cpu_input("input_ids", np.ascontiguousarray(tokens[:, t : t + 1]))
            binding.bind_cpu_input("cache_position", np.array([start + t], dtype=np.int64))
            binding.clear_binding_outputs()
            for name in self.output_names:
                binding.bind_output(name, self.device)
            self.session.run_with_iobinding(binding)
            out = binding.get_outputs()  # OrtValues, on the device
            logits.append(out[0].numpy())
            for name, value in zip(past, out[1:], strict=True):
                binding.bind_ortvalue_input(name, value)
        return logits


def load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> OrtSession:
    return OrtSession(Path(spec.export_dir) / meta["artifact"], spec)
