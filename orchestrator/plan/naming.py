"""Variant names: `{model}_{phase}_{backend}_{device}` plus a suffix for each swept axis that
varies among the variants sharing that base name (`_ctx2048`, `_fp16`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from orchestrator.plan.variant import Variant

# how a varying axis reads in a variant name; others read `{leaf}{value}`
SHORT = {
    "phase.context_len": "ctx",
    "phase.prompt_len": "p",
    "phase.batch": "b",
    "phase.cache_len": "cache",
    "model.kv_cache": "kv",
    "model.attention": "",
    "model.size": "",
    "backend.export_options.passes": "passes-",
}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def suffix(key: str, value: Any) -> str:
    if key == "phase.app":  # a captured variant beside synthetic ones or another application's
        return "captured-" + str(value).partition(":")[0].rsplit(".", 1)[-1]
    if key == "model.dtype":
        return DTYPE_SHORT.get(value, str(value))
    if key == "model.checkpoint":
        return f"ckpt-{Path(value).name}" if value else "random"
    if key == "model.revision":  # a Hub id's commit: its first 7 hex digits, as git abbreviates it
        return f"rev-{str(value)[:7]}" if value else "rev-none"
    prefix = SHORT.get(key, key.rsplit(".", 1)[-1])
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if text.startswith("["):  # a list, as params hold it (JSON): its items joined, or "none"
        text = "+".join(str(item) for item in json.loads(text)) or "none"
    return f"{prefix}{text}".replace("/", "-").replace(" ", "")


def swept_keys(overrides: list[list[str]]) -> set[str]:
    """Config keys the user set on the command line (`phase.context_len=128,512` -> phase.context_len)."""
    keys = set()
    for o in {o for job in overrides for o in job}:  # each distinct override once
        key = o.split("=", 1)[0].lstrip("+~")
        if not key.startswith("hydra"):
            keys.add(key)
    return keys


def name_variants(variants: list[Variant], overrides: list[list[str]], phases: Iterable[ModuleType]) -> list[str]:
    """Each variant's name, in order. Values that follow from another choice (a preset's family,
    a derived cache size) never add a suffix; names that still read alike (checkpoints in folders
    of one name) end in their params' digest. `phases`: the sweep's phase modules, whose
    NAMING_KEYS are named when they vary though no one swept them (a captured application's shapes)."""
    # choosing a model/phase/backend/device option is already in the base name; other
    # group choices (bench=quick) make every key of that group eligible
    swept = swept_keys(overrides) - {"model", "phase", "backend", "device"}
    swept |= {key for phase in phases for key in phase.NAMING_KEYS}

    @cache
    def eligible(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in swept for i in range(1, len(parts) + 1)) and Variant.naming_axis(key)

    groups: dict[str, list[int]] = {}  # base name -> the positions of its variants
    for i, v in enumerate(variants):
        groups.setdefault(v.base_name, []).append(i)
    names = [""] * len(variants)
    for positions in groups.values():
        members = [variants[i] for i in positions]
        keys = sorted(filter(eligible, {k for v in members for k in v.params}))
        varying = [k for k in keys if len({repr(v.params.get(k)) for v in members}) > 1]
        for i, v in zip(positions, members, strict=True):
            names[i] = v.base_name + "".join(f"_{suffix(k, v.params[k])}" for k in varying if v.params.get(k) is not None)
    counts = Counter(names)
    return [n if counts[n] == 1 else f"{n}-{v.identity()[:6]}" for n, v in zip(names, variants, strict=True)]
