"""Plain descriptions of the work a task does and what it returns.

Stdlib only: the driver imports this module to build specs, so it must never pull in
torch or any runtime. Every field is a plain value so specs pickle cheaply to Ray
workers and read well in a notebook.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The values each choice-valued key accepts; the driver validates against these before any
# work starts, and the torch-side registries (kv_cache.py, sdpa.py, models.py) match them.
FAMILIES = ("llama", "phi3")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DTYPES = tuple(DTYPE_BYTES)
KV_CACHES = ("static", "dynamic")
ATTENTIONS = ("sdpa", "math")
PHASES = ("prefill", "decode")
DEVICES = ("cpu", "cuda")
EXPORT_FORMATS = ("none", "onnx", "executorch")


@dataclass(frozen=True)
class ModelSpec:
    name: str  # preset name the user chose: "llama", "phi3"
    family: str  # transformers architecture: "llama", "phi3"
    size: str  # preset size: "tiny", "1b", "mini"
    arch: dict[str, Any]  # kwargs of the transformers config class for this size
    checkpoint: str | None = None  # local Hugging Face directory with safetensors weights
    dtype: str = "float32"
    seed: int = 0
    kv_cache: str = "static"  # tasks/kv_cache.py implementation
    attention: str = "sdpa"  # tasks/sdpa.py implementation


@dataclass(frozen=True)
class PhaseSpec:
    name: str  # "prefill" | "decode"
    batch: int
    prompt_len: int | None = None  # prefill: prompt tokens processed in one call
    context_len: int | None = None  # decode: positions already held by the KV cache
    cache_len: int | None = None  # decode: capacity of a fixed-size KV cache
    parity_steps: int = 8  # decode: consecutive steps checked against eager
    seed: int = 0  # seed of the generated token ids

    @property
    def new_tokens(self) -> int:
        """Tokens processed per sequence in one timed call."""
        return self.prompt_len if self.name == "prefill" else 1

    def capacity(self) -> int:
        """Positions a decode cache must hold: cache_len, or context + checked steps."""
        return self.cache_len or (self.context_len + self.parity_steps)


@dataclass(frozen=True)
class ExportSpec:
    key: str  # content hash of everything that changes the artifact
    model: ModelSpec
    phase: PhaseSpec
    export_format: str  # "onnx" | "pte" | "none" (eager-style backends)
    out_dir: str  # the export cache entry this job fills
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchOptions:
    warmup_iters: int = 5
    warmup_max_seconds: float = 10.0
    min_iters: int = 20
    min_seconds: float = 1.0
    max_iters: int = 100_000
    max_seconds: float = 60.0
    threads: int | None = None  # None: every core the worker was given
    cv_threshold: float = 0.10
    parity_atol: float = 1e-4


@dataclass(frozen=True)
class BenchSpec:
    variant: str
    backend: str  # module name in tasks/runtimes/
    device: str  # "cpu" | "cuda"
    model: ModelSpec
    phase: PhaseSpec
    export_dir: str  # the export cache entry with the artifact, inputs and reference
    out_dir: str  # where this job writes its own files (raw samples)
    bench: BenchOptions = field(default_factory=BenchOptions)
    backend_options: dict[str, Any] = field(default_factory=dict)
    peak_bandwidth_gbs: float | None = None  # device memory peak; None: looked up by GPU name


@dataclass
class Failure:
    stage: str  # "export" | "load" | "parity" | "benchmark"
    error: str
    traceback: str = ""


@dataclass
class ExportResult:
    key: str
    out_dir: str
    ok: bool
    cache_hit: bool = False
    artifact: str | None = None  # path of the .onnx / .pte, None for eager backends
    export_seconds: float = 0.0
    artifact_mb: float = 0.0
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None


@dataclass
class BenchResult:
    variant: str
    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # name -> path to log as artifact
    env: dict[str, str] = field(default_factory=dict)  # where it ran: CPU, GPU, library versions
    failure: Failure | None = None
