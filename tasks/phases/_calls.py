"""The torch-free half of the capture (tasks/phases/_capture.py): the driver checks the app's
name, selects the calls to keep and describes the result with these."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from tasks.specs import CaptureResult, ConfigError

KINDS = ("prefill", "decode")
SELECT = ("spread", "first", "longest")
APP_FORMAT = "package.module:function"


def parse_app(app: str) -> tuple[str, str]:
    """(module, function) of `package.module:function`, or a ConfigError naming the format."""
    module, sep, function = (app or "").partition(":")
    ok = sep and module and function and all(p.isidentifier() for p in (*module.split("."), *function.split(".")))
    if not ok:
        raise ConfigError(f"phase.app={app!r} must name a function as {APP_FORMAT} (e.g. examples.generate_app:run)")
    return module, function


def signature_key(call: dict[str, Any]) -> tuple[Any, ...]:
    """Two calls with equal keys do the same work: same kind, batch, new tokens and fill."""
    return (call["kind"], call["batch"], call["new_tokens"], call["context"])


def length(call: dict[str, Any]) -> int:
    """What orders a kind's calls: a prefill's prompt, a decode's context."""
    return call["new_tokens"] if call["kind"] == "prefill" else call["context"]


def select(distinct: list[dict[str, Any]], n: int, rule: str) -> list[dict[str, Any]]:
    """`n` of one kind's distinct calls (each the first call of its signature, in call order).

    spread: the shortest, the longest and evenly spaced in between (by length); first: the
    first n in call order; longest: the n longest. Kept calls come back in call order."""
    if rule not in SELECT:
        raise ConfigError(f"phase.capture.select={rule!r} is not allowed; choose one of: {', '.join(SELECT)}")
    if len(distinct) <= n:
        return list(distinct)
    if rule == "first":
        kept = distinct[:n]
    else:
        ordered = sorted(distinct, key=lambda c: (length(c), c["batch"], c["call"]))
        if rule == "longest":
            kept = ordered[-n:]
        elif n == 1:
            kept = ordered[:1]
        else:
            picks = sorted({round(i * (len(ordered) - 1) / (n - 1)) for i in range(n)})
            kept = [ordered[i] for i in picks]
    return sorted(kept, key=lambda c: c["call"])


def distinct_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each distinct signature once: its first call, with how many calls shared it."""
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in calls:
        key = signature_key(c)
        if key in first:
            first[key]["count"] += 1
        else:
            first[key] = {**c, "count": 1}
    return list(first.values())


def describe(result: CaptureResult) -> str:
    """One line: calls seen, distinct signatures by kind, which became variants."""
    kinds: dict[str, int] = {}
    for c in result.calls:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    by_kind = ", ".join(f"{n} {k}" for k, n in kinds.items())
    kept = ", ".join(
        f"{p.kind} " + (f"p{p.prompt_len}" if p.kind == "prefill" else f"ctx{p.context_len}") + (f" b{p.batch}" if p.batch != 1 else "")
        for p in result.kept
    )
    return f"{result.total_calls} model calls, {len(result.calls)} distinct signatures ({by_kind}); kept: {kept}"


def summary(result: CaptureResult) -> dict[str, Any]:
    """The capture's record as JSON: calls seen, distinct signatures, kept, the app's timings."""
    return {
        "total_calls": result.total_calls,
        "distinct_signatures": result.calls,
        "kept": [asdict(p) for p in result.kept],
        "not_representable": result.notes,
        "timings": result.timings,
        "loop_at_kept_calls": result.at_calls,
    }


def read_inputs(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {name: z[name] for name in z.files}
