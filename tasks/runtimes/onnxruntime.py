"""ONNX Runtime: CPU execution provider, or CUDA when device=cuda. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.specs import PAST, BenchSpec, choice

LIBRARIES = ("onnxruntime",)
PRELOAD = ("onnxruntime", "onnx")  # what a fork server imports for its children (tasks/worker/forks.py); onnx reads the optimised graph (tasks/export/_anatomy.py)
MEMORY_FACTOR = 1.5  # peak RSS 6.8 GB benchmarking the Llama-3.2-1B architecture in fp32 (1.4x)
# model dtypes it runs, by device: other combinations are skipped at plan time
DTYPES = {"cpu": ("float32", "float16"), "cuda": ("float32", "float16", "bfloat16")}
DTYPE_NOTE = "ONNX Runtime's CPU provider has no bfloat16 kernels (e.g. Mul)"
OPT_LEVELS = ("disable", "basic", "extended", "all")
PROFILER = "ONNX Runtime's profiler (SessionOptions.enable_profiling), in a session of its own"


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
        self.metrics: dict[str, float] = {}
        self.device = "cuda" if spec.device == "cuda" else "cpu"
        self.session = self._optimized_anatomy(path, opts, providers)
        self._path, self._options, self._providers = path, opts, providers
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.info = {
            "ort_intra_op_threads": spec.bench.threads or 0,  # 0: ONNX Runtime's default (all cores)
            "ort_inter_op_threads": 1,
            "ort_providers": ",".join(self.session.get_providers()),
            "ort_graph_optimization_level": options.graph_optimization_level,
        }
        self._binding = None

    def _optimized_anatomy(self, path: Path, opts: Any, providers: list[str]):
        """The session, made once with ONNX Runtime writing the graph its optimiser produced
        (at backend.options.graph_optimization_level) to a temporary file: its anatomy is
        recorded as metrics ort_graph_nodes, ort_graph_transposes, ... beside the exported
        file's anatomy_*, so a sweep over the level shows what the passes did. A model with
        external weights is loaded as it is (the optimised copy would rewrite GBs)."""
        import tempfile

        import onnxruntime as ort

        from tasks.export._anatomy import onnx_anatomy

        external = any(path.parent.glob(path.name + ".*"))  # model.onnx.data: external weights
        if external or self.device != "cpu":  # the CUDA EP's partitioned graph is not written out
            return ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        with tempfile.TemporaryDirectory(prefix="phasesweep-ort-") as folder:
            severity = opts.log_severity_level
            opts.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
            opts.log_severity_level = 3  # not its warning that level "all" writes hardware-specific ops
            try:
                session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
            finally:
                opts.optimized_model_filepath, opts.log_severity_level = "", severity
            graph = onnx_anatomy(Path(folder) / "optimized.onnx")
        for kind in ("nodes", "transposes", "copies", "casts"):
            self.metrics[f"ort_graph_{kind}"] = float(graph[kind])
        return session

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

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """The call's kernels by op type, from a second session with the same settings and
        ONNX Runtime's profiler on (the timed session never profiles)."""
        import json

        import onnxruntime as ort

        from tasks.measure.profiles import WARMUP, onnxruntime_rows

        opts = self._options  # the timed session's settings: it was made with them already
        before = opts.enable_profiling, opts.profile_file_prefix
        opts.enable_profiling, opts.profile_file_prefix = True, str(folder / "onnxruntime")
        try:
            profiled = ort.InferenceSession(str(self._path), sess_options=opts, providers=self._providers)
        finally:
            opts.enable_profiling, opts.profile_file_prefix = before
        for _ in range(WARMUP + calls):
            profiled.run(self.output_names, feeds)
        trace = json.loads(Path(profiled.end_profiling()).read_text())
        return onnxruntime_rows(trace, WARMUP)

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
