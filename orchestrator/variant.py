"""Variant: the frozen description of one grid point, its params and its keys."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property, lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.config import BackendCfg, DeviceCfg, SweepPoint
from tasks.specs import DTYPE_BYTES, BenchOptions, ModelSpec, PhaseSpec

TASKS_DIR = Path(__file__).resolve().parent.parent / "tasks"
# libraries whose version changes what an export produces
EXPORT_LIBS = {
    "none": ("torch", "transformers"),
    "onnx": ("torch", "transformers", "onnx", "onnxscript"),
    "executorch": ("torch", "transformers", "executorch", "torchao"),
}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


@lru_cache(maxsize=1)
def _tasks_source_hash() -> str:
    """Exports depend on our own graph code too: a change to tasks/ invalidates the cache."""
    h = hashlib.sha256()
    for path in sorted(TASKS_DIR.rglob("*.py")):
        h.update(path.relative_to(TASKS_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _checkpoint_identity(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    root = Path(path).expanduser().resolve()
    files = sorted(root.glob("*.safetensors")) + [root / "config.json"]
    return {
        "path": str(root),
        "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()],
    }


def estimated_parameters(arch: dict[str, Any]) -> int:
    """Parameters of a Llama-layout decoder (Llama, Phi-3, ...) from its config alone: the
    driver sizes memory requests with it and never builds the model."""
    h, layers, heads = arch["hidden_size"], arch["num_hidden_layers"], arch["num_attention_heads"]
    kv = arch.get("num_key_value_heads") or heads
    d = arch.get("head_dim") or h // heads
    attention = h * heads * d + 2 * h * kv * d + heads * d * h  # q, k, v, o
    mlp = 3 * h * arch["intermediate_size"]  # gate, up, down
    embeddings = arch["vocab_size"] * h * (1 if arch.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp + 2 * h) + embeddings + h  # + norms


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists become their JSON text."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list | tuple):
        return {prefix[:-1]: json.dumps(obj)}
    return {prefix[:-1]: obj}


def normalized_phase(phase: PhaseSpec, kv_cache: str) -> PhaseSpec:
    """Drop the fields a phase does not use, so equal work gets equal keys and names."""
    if phase.name == "prefill":
        return replace(phase, context_len=None, cache_len=None, parity_steps=1)
    cache_len = phase.capacity() if kv_cache == "static" else None
    return replace(phase, prompt_len=None, cache_len=cache_len)


@dataclass(frozen=True)
class Variant:
    model: ModelSpec
    phase: PhaseSpec
    backend: BackendCfg
    device: DeviceCfg
    bench: BenchOptions
    overrides: tuple[str, ...] = ()

    @classmethod
    def from_point(cls, point: SweepPoint, overrides: tuple[str, ...] = ()) -> Variant:
        m = point.model
        model = ModelSpec(
            name=m.name,
            family=m.family,
            size="checkpoint" if m.checkpoint else m.size,
            arch={} if m.checkpoint else dict(m.sizes[m.size]),
            checkpoint=str(Path(m.checkpoint).expanduser().resolve()) if m.checkpoint else None,
            dtype=m.dtype,
            seed=m.seed,
            kv_cache=m.kv_cache,
            attention=m.attention,
        )
        phase = normalized_phase(point.phase, m.kv_cache)
        return cls(model, phase, point.backend, point.device, point.bench, tuple(overrides))

    @property
    def base_name(self) -> str:
        return f"{self.model.name}_{self.phase.name}_{self.backend.name}_{self.device.name}"

    @cached_property
    def params(self) -> dict[str, Any]:
        """The flattened variant config, as MLflow params."""
        model = asdict(self.model)
        arch = model.pop("arch")
        return {
            **flatten(model, "model."),
            **flatten(arch, "model.arch."),
            **flatten(asdict(self.phase), "phase."),
            **flatten(asdict(self.backend), "backend."),
            **flatten(asdict(self.device), "device."),
            **flatten(asdict(self.bench), "bench."),
        }

    def naming_axes(self) -> dict[str, Any]:
        """Params that may earn a name suffix when they vary: all but the base name's four
        and those a size preset already implies."""
        skip = {"model.name", "phase.name", "backend.name", "device.name"}
        return {k: v for k, v in self.params.items() if k not in skip and not k.startswith("model.arch.")}

    @cached_property
    def export_key(self) -> str:
        """Hash of everything that changes the exported artifact, its inputs and reference."""
        fmt = self.backend.export_format
        model = asdict(self.model)
        model.pop("name")  # a preset's label does not change the graph
        model["checkpoint"] = _checkpoint_identity(self.model.checkpoint)
        return _digest(
            {
                "model": model,
                "phase": asdict(self.phase),
                "format": fmt,
                # exporter options; eager-style backends (format none) export nothing, so
                # eager and compile share one entry of inputs and reference
                "options": self.backend.options if fmt != "none" else {},
                "versions": {lib: _version(lib) for lib in EXPORT_LIBS[fmt]},
                "tasks": _tasks_source_hash(),
            }
        )

    @cached_property
    def bench_key(self) -> str:
        """Export key + everything that changes the measurement."""
        return _digest(
            {
                "export": self.export_key,
                "backend": self.backend.name,
                "device": asdict(self.device),
                "bench": asdict(self.bench),
                "runtime": _version(
                    {"onnxruntime": "onnxruntime", "executorch": "executorch"}.get(self.backend.name, "torch")
                ),
            }
        )

    @cached_property
    def weight_bytes(self) -> int:
        arch = self.model.arch
        if self.model.checkpoint:
            arch = json.loads((Path(self.model.checkpoint) / "config.json").read_text())
        return estimated_parameters(arch) * DTYPE_BYTES[self.model.dtype]

    def identity(self) -> str:
        """Equal for two grid points that would do exactly the same work."""
        return _digest(self.params)
