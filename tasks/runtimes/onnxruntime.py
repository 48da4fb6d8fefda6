"""ONNX Runtime: CPU execution provider, or CUDA when device=cuda. Imports no torch."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tasks.contract import Runtime
from tasks.export.onnx import EXTERNAL_DATA_BYTES, anatomy, fused_counts
from tasks.export.onnx_io import feeds_for, signature
from tasks.measure.profiles import WARMUP, add, top_ops
from tasks.measure.session import Session, Staged
from tasks.specs import BenchSpec, choice

OPT_LEVELS = ("disable", "basic", "extended", "all")
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


@dataclass(frozen=True)
class Options:
    graph_optimization_level: str = "all"  # ONNX Runtime's graph optimiser: disable | basic | extended | all
    # its intra-op threads spin between parallel work (ONNX Runtime's default: on), and after a run until they park:
    # the fastest back-to-back calls, and a core taken from whatever runs between them (session.intra_op.allow_spinning)
    intra_op_spinning: bool = True

    def __post_init__(self) -> None:
        choice("backend.options.graph_optimization_level", self.graph_optimization_level, OPT_LEVELS)


def session_options(options: Options, threads: int | None) -> Any:
    """ONNX Runtime's SessionOptions for these backend options and intra-op threads (None: its default)."""
    # lazy: onnxruntime, only in a job's process
    import onnxruntime as ort

    opts = ort.SessionOptions()
    level = ort.GraphOptimizationLevel
    opts.graph_optimization_level = {
        "disable": level.ORT_DISABLE_ALL,
        "basic": level.ORT_ENABLE_BASIC,
        "extended": level.ORT_ENABLE_EXTENDED,
        "all": level.ORT_ENABLE_ALL,
    }[options.graph_optimization_level]
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if threads:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.intra_op_spinning else "0")
    return opts


class OrtSession(Session):
    def __init__(self, path: Path, spec: BenchSpec, meta: dict[str, Any] | None = None):
        # lazy: onnxruntime, only in a job's process
        import onnxruntime as ort

        options = Options(**spec.runtime_options)
        providers = PROVIDERS[spec.device]
        missing = [p for p in providers if p not in ort.get_available_providers()]
        if missing:
            raise RuntimeError(
                f"device={spec.device}: onnxruntime {ort.__version__} lacks {', '.join(missing)} "
                f"(available: {', '.join(ort.get_available_providers())})"
            )
        opts = session_options(options, spec.bench.threads)
        self.metrics: dict[str, float] = {}
        self.device = "cuda" if spec.device == "cuda" else "cpu"
        self.session = self._optimized_anatomy(path, opts, providers)
        self._path, self._options, self._providers = path, opts, providers
        self.feeds = feeds_for(signature(path), meta or {})  # the phase's feeds -> this file's inputs
        self.output_names = self.feeds.output_names
        self.info = {
            "ort_intra_op_threads": spec.bench.threads or 0,  # 0: ONNX Runtime's default (all cores)
            "ort_inter_op_threads": 1,
            "ort_providers": ",".join(self.session.get_providers()),
            "ort_graph_optimization_level": options.graph_optimization_level,
            "ort_intra_op_spinning": options.intra_op_spinning,
        }
        self._binding = None

    def _optimized_anatomy(self, path: Path, opts: Any, providers: list[str]):
        """The session, with the graph ONNX Runtime's optimiser made written out once and its
        anatomy recorded as ort_graph_* metrics: movement kinds and the fused ops' counts. Not
        for external weights past EXTERNAL_DATA_BYTES (it would copy GBs) nor CUDA (whose
        partitioned graph is not written)."""

        # lazy: onnxruntime, only in a job's process
        import onnxruntime as ort

        external = sum(p.stat().st_size for p in path.parent.glob(path.name + ".*"))
        if external > EXTERNAL_DATA_BYTES or self.device != "cpu":
            return ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        with tempfile.TemporaryDirectory(prefix="phasesweep-ort-") as folder:
            severity = opts.log_severity_level
            opts.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
            opts.log_severity_level = 3  # not its warning that level "all" writes hardware-specific ops
            try:
                session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
            finally:
                opts.optimized_model_filepath, opts.log_severity_level = "", severity
            graph = anatomy(Path(folder) / "optimized.onnx")
        for kind in ("nodes", "transposes", "copies", "casts"):
            self.metrics[f"ort_graph_{kind}"] = float(graph[kind])
        for op, n in fused_counts(graph).items():
            self.metrics[f"ort_graph_{op}"] = float(n)
        return session

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, self.feeds.host(feeds))

    def bind(self, feeds: dict[str, np.ndarray]):
        """Inputs copied to the device once; outputs left to ONNX Runtime's allocator there
        (preallocated outputs would make ORT copy into them)."""
        binding = self._bound(self.place(self.feeds.host(feeds)))
        self._binding = binding
        session = self.session
        return lambda: session.run_with_iobinding(binding)

    def _bound(self, inputs: dict[str, Any]):
        binding = self.session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        shared = self.feeds.shared(inputs, self)  # outputs the graph writes into an input's buffer in place
        for name in self.output_names:
            if name in shared:
                binding.bind_ortvalue_output(name, shared[name])
            else:
                binding.bind_output(name, self.device)
        return binding

    def sync(self) -> None:
        if self._binding is not None and self.device == "cuda":
            self._binding.synchronize_outputs()

    def place(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        # lazy: onnxruntime, only in a job's process
        import onnxruntime as ort

        return {n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), self.device, 0) for n, a in arrays.items()}

    def step(self, inputs: dict[str, Any]) -> list[Any]:
        staged = self.staged(inputs)
        staged.call()
        return staged.outputs()

    def staged(self, inputs: dict[str, Any]) -> Staged:
        """The inputs bound now; the call runs the binding, its outputs OrtValues on the device."""
        binding = self._bound(self.feeds.placed(inputs, self))
        return Staged(partial(self.session.run_with_iobinding, binding), binding.get_outputs)

    def to_host(self, logits: Any) -> np.ndarray:
        return logits.numpy()

    def shape(self, value: Any) -> tuple[int, ...]:
        """An OrtValue's shape (tasks/export/onnx_io.py asks it of placed inputs)."""
        return tuple(value.shape())

    def profile(self, feeds: dict[str, np.ndarray], calls: int, folder: Path) -> list[dict[str, Any]]:
        """Kernels by op type, from a second session with the same settings and the profiler on."""

        # lazy: onnxruntime, only in a job's process
        import onnxruntime as ort

        opts = self._options
        before = opts.enable_profiling, opts.profile_file_prefix
        opts.enable_profiling, opts.profile_file_prefix = True, str(folder / "onnxruntime")
        try:
            profiled = ort.InferenceSession(str(self._path), sess_options=opts, providers=self._providers)
        finally:
            opts.enable_profiling, opts.profile_file_prefix = before
        for _ in range(WARMUP + calls):
            profiled.run(self.output_names, self.feeds.host(feeds))
        return profile_rows(json.loads(Path(profiled.end_profiling()).read_text()), WARMUP)


def profile_rows(trace: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The kernels of the profiler's trace (Chrome trace format, us), runs after the first `warmup`."""
    runs = sorted((e for e in trace if e.get("name") == "model_run"), key=lambda e: e["ts"])[warmup:]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in runs]
    per_op: dict[str, tuple[int, float]] = {}
    for e in trace:
        if e.get("cat") == "Node" and any(a <= e["ts"] <= b for a, b in spans):
            add(per_op, e["args"].get("op_name", e["name"]), float(e["dur"]))
    return top_ops(per_op, len(runs), float(sum(b - a for a, b in spans)))


class OrtRuntime(Runtime):
    LIBRARIES = ("onnxruntime",)
    REQUIRES = ("onnxruntime",)
    PRELOAD = ("onnxruntime", "onnx")  # onnx reads the optimised graph's anatomy
    Options = Options
    DTYPES = {"cpu": ("float32", "float16"), "cuda": ("float32", "float16", "bfloat16")}
    DTYPE_NOTE = "ONNX Runtime's CPU provider has no bfloat16 kernels (e.g. Mul)"
    # model.quant by device: the file's MatMulNBits (tasks/export/_onnx_quant.py), run on CPU here
    QUANTS = {"cpu": ("none", "int8", "int4", "8da4w"), "cuda": ("none",)}
    QUANT_NOTE = (
        "ONNX Runtime's MatMulNBits ran here on the CPU provider only; on CUDA it is unverified, and "
        "8da4w's int8 activations (accuracy_level=4) are the CPU provider's"
    )
    PROFILER = "ONNX Runtime's profiler (SessionOptions.enable_profiling), in a session of its own"

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> OrtSession:
        return OrtSession(Path(spec.export_dir) / meta["artifact"], spec, meta)


RUNTIME = OrtRuntime()
