"""Checks of single values the config schemas share: names, typed option dicts, bench
settings, folders a sweep writes. Each refusal names the key, the value and what is allowed."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from tasks.specs import BenchOptions, ConfigError, at_least

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")


def safe_name(key: str, value: str) -> None:
    """Names reach run names and file paths: letters, digits, `_ . -`, at most 48, no `..`."""
    if not isinstance(value, str) or not NAME.fullmatch(value) or ".." in value:
        raise ConfigError(
            f"{key}={value!r} is not a usable name: use 1 to 48 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (it becomes part of run names and file paths)"
        )


def typed(key: str, schema: type, values: Any) -> dict[str, Any]:
    """Options checked against a module's Options dataclass: unknown keys and wrong types
    are refused with the allowed keys; its __post_init__ checks the values. Returns the
    complete options (defaults filled in) as a plain dict."""
    allowed = ", ".join(f.name for f in fields(schema)) or "(none)"
    base = OmegaConf.structured(schema)
    OmegaConf.set_readonly(base, False)
    try:
        merged = OmegaConf.to_container(OmegaConf.merge(base, values or {}), resolve=True)
    except ConfigKeyError as e:
        raise ConfigError(f"{key}.{e.key} is not a known key; allowed keys: {allowed}") from None
    except OmegaConfBaseException as e:  # a wrong type; `values` is a plain dict (or a DictConfig)
        value = (values or {}).get(e.key) if e.key is not None else None
        raise ConfigError(f"{key}.{e.key}={value!r}: {str(e).splitlines()[0]}") from None
    return asdict(schema(**merged))


EXPERIMENT_NAME_MAX = 256  # MLflow's experiments.name column (PostgreSQL enforces it)


def check_writable(key: str, folder: str | Path) -> Path:
    """`folder`, made if missing and written to once, or a ConfigError naming the key."""
    path = Path(folder).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".phasesweep-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{key}={str(folder)!r} is not a writable folder ({e.strerror or e})") from None
    return path


def check_bench(b: BenchOptions) -> None:
    for key in ("warmup_iters", "min_iters", "max_iters", "repeats"):
        at_least(f"bench.{key}", getattr(b, key), 1)
    for key in ("warmup_max_seconds", "min_seconds", "max_seconds", "target_ci", "unstable_iqr"):
        at_least(f"bench.{key}", getattr(b, key), 0)
    at_least("bench.parity_atol", b.parity_atol, 0, optional=True)
    at_least("bench.threads", b.threads, 1, optional=True)
    if b.min_iters > b.max_iters:
        raise ConfigError(f"bench.min_iters={b.min_iters} exceeds bench.max_iters={b.max_iters}")
    at_least("bench.quality_tokens", b.quality_tokens, 1)
    if b.quality and b.quality_text is not None:
        text = Path(b.quality_text).expanduser()
        if not text.is_file():
            raise ConfigError(
                f"bench.quality_text={b.quality_text!r} is not a file; name a UTF-8 text file, or null for the "
                "held-out part of pydoc_data's topics"
            )


def fraction(key: str, value: float) -> None:
    """A fraction strictly between 0 and 1, or a ConfigError naming the key."""
    if not 0 < value < 1:
        raise ConfigError(f"{key}={value!r}: give a fraction between 0 and 1 (0.05: 5%)")


def baseline_last(key: str, baseline: str | None) -> int | None:
    """N of `last:N`; None for a named sweep run (a run's id or name: no blanks) or no baseline."""
    if baseline is None:
        return None
    value = str(baseline)
    n = value.removeprefix("last:")
    if not value.strip() or any(c.isspace() for c in value) or (n != value and not (n.isdigit() and int(n) >= 1)):
        raise ConfigError(f"{key}={baseline!r}: give last:N (a whole N >= 1, e.g. last:5) or a sweep run's id or name")
    return int(n) if n != value else None

