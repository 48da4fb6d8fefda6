"""Plain descriptions of the work a task does and what it returns.

Stdlib only: the driver imports this module to build specs, so it must never pull in
torch or any runtime. Every field is a plain value so specs pickle cheaply to Ray
workers and read well in a notebook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The values each choice-valued key accepts; the driver validates against these before any
# work starts, and the torch-side registries (kv_cache.py, sdpa.py) match them (tested).
# Phases, export formats and runtimes are registries of modules: tasks/phases/,
# tasks/export/, tasks/runtimes/.
# Model families are one table with their adapters: tasks/model/families.py FAMILIES.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DTYPES = tuple(DTYPE_BYTES)
KV_CACHES = ("static", "dynamic", "update_cache")
ATTENTIONS = ("sdpa", "math", "custom_sdpa")
# ExecuTorch's LLM custom ops (executorch.extension.llm.custom_ops) come as a pair: the cache
# kept inside the graph [B, S_max, H_kv, D], written in place by llama::update_cache, is the
# layout llama::custom_sdpa reads (with the start position for its causal mask)
LLAMA_OPS = {"model.kv_cache": "update_cache", "model.attention": "custom_sdpa"}
IN_GRAPH_KV_CACHES = ("update_cache",)  # the graph holds its cache: no past/present inputs and outputs
# a feed that is no graph input: the tokens an in-graph cache is filled with (positions
# 0..C-1, one call through the program) before the graph's own inputs are run
CONTEXT = "context_ids"
DEVICES = ("cpu", "cuda")
# weight quantisation of the linear layers (tasks/model/quant.py): none | int8 (weight-only,
# per channel) | int4 (weight-only, group-wise) | 8da4w (dynamic int8 activations, int4 group-wise weights)
# | q4_k_m (llama.cpp's Q4_K_M mix of 4- and 6-bit k-quants: the gguf format's own, tasks/export/gguf.py);
# each format and runtime lists those it makes or runs (tasks/contract.py QUANTS)
QUANTS = ("none", "int8", "int4", "8da4w", "q4_k_m")
GROUPED_QUANTS = ("int4", "8da4w")  # model.quant_group applies to these
QUANT_GROUP_STEP = 32  # XNNPACK's blockwise kernels take groups of a multiple of 32; torchao's int4: 32 to 256

# Graph input/output names of the KV cache, one pair per layer: `past_key_values.{i}.key`
# in, `present.{i}.key` out. Every module that builds or reads them uses these.
PAST = "past_key_values."
PRESENT = "present."


def resolve_attention(kv_cache: str, attention: str) -> str:
    """model.attention=auto: the kv_cache's own attention (custom_sdpa reads update_cache's layout), else sdpa."""
    if attention != "auto":
        return attention
    return LLAMA_OPS["model.attention"] if kv_cache == LLAMA_OPS["model.kv_cache"] else "sdpa"


def check_model_choices(kv_cache: str, attention: str) -> None:
    """model.kv_cache=update_cache and model.attention=custom_sdpa only together (LLAMA_OPS)."""
    chosen = {"model.kv_cache": kv_cache, "model.attention": attention}
    used = [k for k, v in LLAMA_OPS.items() if chosen[k] == v]
    if len(used) == 1:
        (key,) = used
        (other,) = (k for k in LLAMA_OPS if k != key)
        raise ConfigError(
            f"{key}={chosen[key]!r} needs {other}={LLAMA_OPS[other]!r} (got {other}={chosen[other]!r}): "
            "ExecuTorch's llama::update_cache keeps the cache in the graph as [B, S_max, H_kv, D], the layout "
            "llama::custom_sdpa reads; choose both, or neither (static/dynamic with sdpa/math)"
        )


def check_quant(quant: str, group: int) -> None:
    """model.quant one of QUANTS; model.quant_group a positive multiple of QUANT_GROUP_STEP."""
    choice("model.quant", quant, QUANTS)
    if not isinstance(group, int) or isinstance(group, bool) or group < QUANT_GROUP_STEP or group % QUANT_GROUP_STEP:
        raise ConfigError(
            f"model.quant_group={group!r} is not allowed; choose a positive multiple of {QUANT_GROUP_STEP} (32, 64, 128, "
            "256, ...): XNNPACK's blockwise int4 kernels need one"
        )


def kv_names(prefix: str, layers: int) -> list[str]:
    """[prefix0.key, prefix0.value, prefix1.key, ...] for PAST or PRESENT."""
    return [f"{prefix}{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key, the value and the choices."""


def choice(key: str, value: Any, allowed: Any) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def at_least(key: str, value: Any, low: float, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or value < low:
        raise ConfigError(f"{key}={value!r} must be >= {low:g}" + (" (or null)" if optional else ""))


@dataclass(frozen=True)
class ModelSpec:
    name: str  # preset name the user chose: "llama", "phi3"
    family: str  # transformers architecture: "llama", "phi3"
    size: str  # preset size: "tiny", "1b", "mini"
    arch: dict[str, Any]  # kwargs of the transformers config class for this size
    checkpoint: str | None = None  # local Hugging Face directory with safetensors weights, or a Hub id
    dtype: str = "float32"
    seed: int = 0
    kv_cache: str = "static"  # tasks/model/kv_cache.py implementation
    attention: str = "sdpa"  # tasks/model/sdpa.py implementation
    quant: str = "none"  # QUANTS: weight quantisation, made by each format's or runtime's own path
    quant_group: int = 32  # group size of int4 / 8da4w weights
    revision: str | None = None  # a Hub id's commit hash (tasks/model/hub.py); None for a folder or preset


@dataclass  # not frozen: OmegaConf cannot merge values into a frozen dataclass nested in a schema
class CaptureOptions:
    """phase=captured: which of the application's calls become variants (tasks/phases/_capture.py)."""

    max_variants: int = 3  # per kind of call (prefill, decode)
    select: str = "spread"  # "spread" | "first" | "longest": which distinct calls are kept
    timed_runs: int = 3  # runs of the application timed after the capture run (TTFT, inter-token)


@dataclass(frozen=True)
class PhaseSpec:
    name: str  # a module of tasks/phases/: "prefill" | "decode" | "captured"
    batch: int
    prompt_len: int | None = None  # prefill: prompt tokens processed in one call
    context_len: int | None = None  # decode: positions already held by the KV cache
    cache_len: int | None = None  # decode: capacity of a fixed-size KV cache
    parity_steps: int = 8  # decode: consecutive steps checked against eager
    seed: int = 0  # seed of the generated token ids
    # decode: cache depths measured from the one export besides context_len (tasks/phases/decode.py
    # series); normalised to the sorted depths with context_len among them
    depths: tuple[int, ...] | None = None
    # captured (tasks/phases/captured.py): the application and, once it ran, the call kept
    app: str | None = None  # "package.module:function", called with the model phasesweep built
    capture: CaptureOptions | None = field(default_factory=CaptureOptions)  # before the capture: which calls become variants
    kind: str | None = None  # the kind of call kept: "prefill" | "decode" (its graph and parity)
    call: int | None = None  # its index among the application's model calls
    inputs: str | None = None  # the .npz of its recorded inputs, named by their content digest

    @property
    def label(self) -> str:
        """The phase as variant names, export folders and the runs' `phase` tag read it: a
        captured call reads as the kind of call it is (llama_decode_...), every other phase as its name."""
        return self.kind or self.name


# env.pip: exact pins only (NAME==VERSION), so an environment is one set of versions, keyed and
# rebuilt the same on every node (tasks/worker/envs.py)
PIN = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


def check_pins(key: str, value: Any) -> tuple[str, ...]:
    """`value` (null, one `NAME==VERSION` string or a list of them) as its sorted pins, or a
    ConfigError naming the key, the value and the form allowed."""
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) and PIN.match(i.strip()) for i in items):
        raise ConfigError(
            f"{key}={value!r} is not allowed; give exact pins NAME==VERSION, one or a list "
            f"(e.g. {key}='\"onnxruntime==1.30.0\"' or {key}='[\"onnxruntime==1.30.0\",\"onnx==1.19.0\"]'), or null"
        )
    pins = sorted(i.strip() for i in items)
    names = [dist_name(PIN.match(p).group(1)) for p in pins]
    if len(set(names)) < len(names):
        raise ConfigError(f"{key}={value!r} pins one library twice; give each NAME once")
    if OWN_DIST in names:
        raise ConfigError(f"{key}={value!r} pins phasesweep itself; pin the libraries it runs with")
    return tuple(pins)


def dist_name(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): onnx_runtime, ONNX.Runtime -> onnx-runtime."""
    return re.sub(r"[-_.]+", "-", name).lower()


OWN_DIST = "phasesweep"


@dataclass(frozen=True)
class EnvSpec:
    """The libraries a variant runs with instead of the driver's (env.pip): exact pins,
    installed once per node beside the export cache and put first on the import path of the
    variant's export and benchmark processes (tasks/worker/envs.py). Empty: the driver's own."""

    pip: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        """What a variant's name ends with: `_onnxruntime-1.30.0` per pin; "" for none."""
        return "".join(f"_{p.replace('==', '-')}" for p in self.pip)


@dataclass(frozen=True)
class CaptureSpec:
    """Run an application on the model and record its calls (tasks/phases/_capture.py)."""

    key: str  # content hash of the model, the application and the options
    model: ModelSpec
    app: str  # "package.module:function"
    options: CaptureOptions
    parity_steps: int  # decode steps of the application's own tokens kept for each decode call
    store: str  # folder the kept calls' inputs are written to, one .npz per content digest
    app_path: str = ""  # prepended to sys.path: the folder the user ran the sweep from
    threads: int | None = None  # torch threads while the application runs (None: torch's default)


@dataclass
class CaptureResult:
    key: str
    ok: bool
    calls: list[dict[str, Any]] = field(default_factory=list)  # every distinct signature, with its count
    total_calls: int = 0  # forward calls the capture run saw
    kept: list[PhaseSpec] = field(default_factory=list)  # the calls that become variants
    timings: dict[str, float] = field(default_factory=dict)  # the application's own: TTFT, inter-token, ...
    inter_token_ns: list[int] = field(default_factory=list)  # of every timed run, pooled
    at_calls: dict[int, dict[str, float]] = field(default_factory=dict)  # kept call -> the app's own loop there
    notes: list[str] = field(default_factory=list)  # calls no phasesweep graph represents, and why
    failure: Failure | None = None


@dataclass(frozen=True)
class AppLoopSpec:
    """A captured application run again with its model's forward answered by a runtime's sessions
    of the captured prefill and decode exports (tasks/app_loop.py): the loop a user of
    that runtime feels, timed as the capture timed the application."""

    key: str  # the captured variants' job: what the driver files the result under
    capture: CaptureSpec  # the application, its model and threads
    prefill: BenchSpec  # the captured prompt's variant
    decode: BenchSpec  # a captured decode variant whose export holds every depth the loop reaches


@dataclass
class AppLoopResult:
    key: str
    ok: bool
    timings: dict[str, float] = field(default_factory=dict)  # as CaptureResult.timings: app_ttft_ms, ...
    tokens_agree: float | None = None  # share of the generated tokens equal to the application's own on transformers
    failure: Failure | None = None


@dataclass(frozen=True)
class QualitySpec:
    """What the export stores for the quality measurement (tasks/phases/_quality.py)."""

    tokens: int  # positions predicted, at least (bench.quality_tokens)
    text: str | None = None  # a UTF-8 text file; None: the held-out part of pydoc_data's topics


@dataclass(frozen=True)
class ExportSpec:
    key: str  # content hash of everything that changes the artifact
    model: ModelSpec
    phase: PhaseSpec
    export_format: str  # a module of tasks/export/: "onnx" | "executorch" | "none" (eager-style backends)
    out_dir: str  # the export cache entry this job fills
    options: dict[str, Any] = field(default_factory=dict)  # the format's typed Options, as a dict
    quality: QualitySpec | None = None  # None: no quality inputs (bench.quality=false)
    env: EnvSpec = field(default_factory=EnvSpec)  # the libraries it is made with (env.pip)


@dataclass(frozen=True)
class BenchOptions:
    warmup_iters: int = 5
    warmup_max_seconds: float = 10.0
    min_iters: int = 20
    min_seconds: float = 1.0
    max_iters: int = 100_000
    max_seconds: float = 60.0
    target_ci: float = 0.02  # stop once the median's 95% CI half-width is within this share of it
    threads: int | None = None  # None: every core the worker was given
    unstable_iqr: float = 0.10  # IQR / median above which a variant is flagged unstable
    parity_atol: float | None = None  # None: by model dtype (tasks/measure/parity.py ATOL)
    repeats: int = 1  # fresh processes per variant, run in random interleaved order across the sweep
    profile: bool = False  # per-op profile after the timed loop (tasks/measure/profiles.py), never during it
    quality: bool = True  # after the timed loop: KL, top-1 and perplexity against float32 eager (tasks/phases/_quality.py)
    quality_tokens: int = 256  # positions predicted
    quality_text: str | None = None  # a UTF-8 text file; None: the held-out part of pydoc_data's topics


@dataclass(frozen=True)
class BenchSpec:
    variant: str
    runtime: str  # a module of tasks/runtimes/ ("onnxruntime") or an importable module path
    device: str  # "cpu" | "cuda"
    model: ModelSpec
    phase: PhaseSpec
    export_dir: str  # the export cache entry with the artifact, inputs and reference
    bench: BenchOptions = field(default_factory=BenchOptions)
    runtime_options: dict[str, Any] = field(default_factory=dict)  # the runtime's typed Options, as a dict
    peak_bandwidth_gbs: float | None = None  # device memory peak; None: looked up by GPU name
    env: EnvSpec = field(default_factory=EnvSpec)  # the libraries it runs with (env.pip)
    # a captured call: its application's own time between forwards there (ms, from the capture), after
    # which its call is timed again besides back to back (tasks/measure/rhythm.py); None: not timed so
    rhythm_gap_ms: float | None = None


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
    anatomy: dict[str, Any] | None = None  # tasks/measure/anatomy.py: the artifact's anatomy; None without one
    failure: Failure | None = None


@dataclass
class BenchResult:
    variant: str
    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    samples_ns: list[int] = field(default_factory=list)  # raw timed samples, returned inline
    first_call_ns: int = 0
    env: dict[str, str] = field(default_factory=dict)  # where it ran: CPU, GPU, library versions
    profile: list[dict[str, Any]] = field(default_factory=list)  # bench.profile: tasks.measure.profiles.top_ops rows
    # figures measured along a series (decode's phase.depths): metric -> [(step, value)], recorded as MLflow step metrics
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    failure: Failure | None = None
