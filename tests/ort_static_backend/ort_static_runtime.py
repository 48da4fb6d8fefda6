"""Test-only backend `ort_static`: a runtime for the existing format `onnx` that runs a file on
ONNX Runtime's CPU provider with fixed-size cache buffers only, and so refuses
model.kv_cache=dynamic by itself (its own limits(), tasks/contract.py).

Not part of phasesweep: it lives here, outside conf/ and tasks/, to show that a runtime for an
existing format is one module plus one yaml. To use it, put this folder on PYTHONPATH and its
conf/ on Hydra's search path:

    PYTHONPATH=tests/ort_static_backend python sweep.py backend=ort_static \\
        'hydra.searchpath=[file://'$PWD'/tests/ort_static_backend/conf]'
"""

from __future__ import annotations

from pathlib import Path

from tasks.contract import Point, Runtime
from tasks.runtimes.onnxruntime import Options as OrtOptions


class OrtStaticRuntime(Runtime):
    LIBRARIES = ("onnxruntime",)
    REQUIRES = ("onnxruntime",)
    PRELOAD = ("onnxruntime", "onnx", "ort_static_runtime")  # what its fork server imports once
    Options = OrtOptions  # backend.options: ONNX Runtime's own (graph_optimization_level)
    DTYPES = {"cpu": ("float32", "float16")}

    def limits(self, point: Point) -> str | None:
        if point.model.kv_cache == "dynamic":
            return f"backend {point.backend} binds fixed-size cache buffers only: model.kv_cache=dynamic grows them"
        return None

    def load(self, spec, meta, feeds):
        from tasks.runtimes.onnxruntime import OrtSession

        return OrtSession(Path(spec.export_dir) / meta["artifact"], spec, meta)


RUNTIME = OrtStaticRuntime()
