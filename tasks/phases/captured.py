"""Captured: the phases of a real application, run by tasks/phases/_capture.py.

In the config (phase=captured) the phase names the application, `phase.app`, and how its
calls become variants, `phase.capture`. The driver runs the capture before it plans; each
call kept becomes a variant whose phase is captured, of a kind:

  kind=prefill  the application's prompt as prefill's graph takes it: input_ids [B, P]
  kind=decode   its cache before the call, laid out as model.kv_cache says, and its token,
                as decode's graph takes them: input_ids [B, 1], cache_position [1],
                past_key_values.{i}.key/value [B, H_kv, S, D]

Graph, names, parity and metrics are the kind's (tasks/phases/prefill.py, decode.py); the
data is the application's: its tokens and its cache, and for a decode call the tokens it fed
on the calls right after (parity's steps), checked against the transformers model on them.
Variants read as their kind (`llama_decode_...`), with the shape that sets them apart.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.model.tensors import to_torch
from tasks.phases import decode, prefill
from tasks.phases._calls import KINDS, SELECT, describe, parse_app, read_inputs, summary
from tasks.phases._capture import capture_in_fresh_process, capture_job, load_app, timed_runs, timings
from tasks.phases._common import PhaseData
from tasks.specs import IN_GRAPH_KV_CACHES, CaptureOptions, ConfigError, PhaseSpec, at_least, choice

if TYPE_CHECKING:
    import torch

# the capture for the driver; the application loaded and timed again on a runtime (tasks/app_loop.py)
__all__ = ["capture_in_fresh_process", "capture_job", "describe", "load_app", "summary", "timed_runs", "timings"]

# keys that set captured variants apart in their names even though no one swept them
NAMING_KEYS = ("phase.app", "phase.batch", "phase.prompt_len", "phase.context_len")
_KIND: dict[str, ModuleType] = {"prefill": prefill, "decode": decode}


def _kind(phase: PhaseSpec) -> ModuleType:
    if phase.kind is None:
        raise ConfigError(
            "phase=captured stands for the calls phase.app makes: the capture runs before the plan and "
            "each kept call becomes a variant (a dry run does not run the application)"
        )
    choice("phase.kind", phase.kind, KINDS)
    return _KIND[phase.kind]


def _as_kind(phase: PhaseSpec) -> PhaseSpec:
    """The kept call as its kind's module sees it (that module refuses phase.app)."""
    return replace(phase, app=None)


def normalize(phase: PhaseSpec, kv_cache: str) -> PhaseSpec:
    """Before the capture the application and its options alone (the calls decide batch and
    lengths); a kept call as its kind normalises it (a static cache's capacity)."""
    if kv_cache in IN_GRAPH_KV_CACHES:
        raise ConfigError(
            f"phase=captured with model.kv_cache={kv_cache!r}: a captured decode call replays the "
            "application's cache as an input, and an in-graph cache takes none; use kv_cache=static or dynamic"
        )
    if phase.kind is None:
        return replace(
            phase, prompt_len=None, context_len=None, cache_len=None, depths=None, seed=0, capture=phase.capture or CaptureOptions()
        )
    return replace(_kind(phase).normalize(_as_kind(phase), kv_cache), app=phase.app, capture=None, seed=0)


def check(phase: PhaseSpec, dims: dict[str, int] | None = None) -> None:
    if phase.app is None:
        raise ConfigError(
            "phase=captured needs phase.app=package.module:function: the application to capture, called "
            "with the model phasesweep builds (e.g. phase.app=examples.generate_app:run)"
        )
    parse_app(phase.app)
    at_least("phase.parity_steps", phase.parity_steps, 1)
    if phase.kind is None:
        options = phase.capture or CaptureOptions()
        at_least("phase.capture.max_variants", options.max_variants, 1)
        choice("phase.capture.select", options.select, SELECT)
        at_least("phase.capture.timed_runs", options.timed_runs, 1)
        return
    _kind(phase).check(_as_kind(phase), dims)
    if not phase.inputs:
        raise ConfigError(f"phase.inputs is missing: a captured {phase.kind} call replays the inputs it recorded")


def series(phase: PhaseSpec) -> tuple[int, ...]:
    """A captured call is measured as the application made it: no series."""
    return ()


def tokens_per_call(phase: PhaseSpec) -> int:
    return _kind(phase).tokens_per_call(phase)


def io_names(phase: PhaseSpec, layers: int, kv_cache: str = "static") -> tuple[list[str], list[str]]:
    return _kind(phase).io_names(phase, layers, kv_cache)


def make_data(model: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int]) -> PhaseData:
    """The recorded call's inputs and the transformers model's reference on them."""
    import torch  # lazy: torch, only in a job's process

    arrays = read_inputs(phase.inputs)
    ids = torch.from_numpy(arrays["input_ids"])
    want = (phase.batch, phase.prompt_len if phase.kind == "prefill" else 1)
    if tuple(ids.shape) != want:
        raise ValueError(f"{phase.inputs}: input_ids {tuple(ids.shape)}, the phase expects {want}")
    if phase.kind == "prefill":
        return prefill.data_from_prompt(model, ids, dims)
    from transformers import DynamicCache  # lazy: torch, only in a job's process


    dtype = str(arrays["cache_dtype"])
    pairs = [
        (to_torch(arrays[f"past.{i}.key"], dtype), to_torch(arrays[f"past.{i}.value"], dtype))
        for i in range(dims["layers"])
    ]
    if pairs[0][0].shape[2] != phase.context_len:
        raise ValueError(f"{phase.inputs}: a cache of {pairs[0][0].shape[2]} positions, the phase expects {phase.context_len}")
    steps = torch.from_numpy(np.ascontiguousarray(arrays["step_tokens"][:, : phase.parity_steps]))
    if steps.shape[1] < phase.parity_steps:  # the loop ended sooner: continue as the reference would, greedily
        steps = _continued(model, DynamicCache([(k.clone(), v.clone()) for k, v in pairs], config=model.config), steps, phase.parity_steps)
    return decode.data_from_cache(model, phase, kv_cache, dims, DynamicCache(pairs, config=model.config), steps)


def _continued(model: torch.nn.Module, cache: Any, steps: torch.Tensor, n: int) -> torch.Tensor:
    """The application's step tokens [B, k], continued to n with the reference's greedy picks."""
    import torch  # lazy: torch, only in a job's process

    with torch.inference_mode():
        for t in range(n - 1):
            logits = model(input_ids=steps[:, t : t + 1], cache=cache, use_cache=True).logits
            if t + 1 == steps.shape[1]:
                steps = torch.cat([steps, logits[:, -1:].argmax(-1)], dim=1)
    return steps


def build_graph(model: torch.nn.Module, phase: PhaseSpec, family: str, kv_cache: str, attention: str) -> torch.nn.Module:
    return _kind(phase).build_graph(model, phase, family, kv_cache, attention)


def check_parity(session: Any, phase: PhaseSpec, feeds: dict, parity: dict, atol: float) -> dict[str, Any]:
    return _kind(phase).check_parity(session, phase, feeds, parity, atol)


def extra_metrics(*, phase: PhaseSpec, **kwargs: Any) -> dict[str, float]:
    return _kind(phase).extra_metrics(phase=phase, **kwargs)


def quality_inputs(
    model: torch.nn.Module, ref: torch.nn.Module, phase: PhaseSpec, kv_cache: str, dims: dict[str, int], take: Any, tokens: int
) -> tuple[dict[str, np.ndarray] | None, str]:
    """The kind's quality windows, at the kept call's shape."""
    return _kind(phase).quality_inputs(model, ref, phase, kv_cache, dims, take, tokens)


def quality_logits(session: Any, phase: PhaseSpec, feeds: dict, q: dict[str, np.ndarray]) -> np.ndarray:
    return _kind(phase).quality_logits(session, phase, feeds, q)
