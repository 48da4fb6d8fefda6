"""A whole generation as users feel it, predicted from a sweep's recorded figures: a prefill
variant of prompt P and the decode variants of the same model, backend and batch (their depth
series, or one point each at its context_len) make a generation of N new tokens:

  token 1        the prefill's pick: TTFT = the prefill's median
  tokens 2..N    one decode step each, at cache depths P .. P+N-2, each step's time the decode
                 medians interpolated linearly in depth (flat beyond the measured ends)

N runs to the deepest decode depth measured: N = deepest - P + 2. Time per output token (TPOT)
is the mean and p90 of the N-1 steps; end-to-end = TTFT + their sum; tokens/s = B*N over it.
Pure arithmetic on medians already recorded: nothing here times or imports a runtime. It reads
the plots' rows (orchestrator/read/plots.py plot_rows), alike for a sweep and a report."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.common.console import table

DEPTH_MEDIAN = "depth_latency_ms_median"  # tasks/depth_series.py: the depth series' medians
MEDIAN = "latency_ms_median"
PROMPT_LEN, CONTEXT_LEN, BATCH = "phase.prompt_len", "phase.context_len", "phase.batch"  # the plots' row params
ARTIFACT, TABLE = "generation.json", "generation_table.json"  # on the sweep's run
RULE = "TTFT = prefill median; TPOT = decode medians interpolated over depths P..P+N-2; N = deepest depth - P + 2"


@dataclass(frozen=True)
class Generation:
    """One predicted generation of a model on one backend (ms; tokens/s aggregate over the batch)."""

    model: str
    backend: str
    device: str
    prefill: str  # the variants it comes from
    decode: tuple[str, ...]
    batch: int
    prompt: int  # P
    new_tokens: int  # N
    depths: tuple[int, ...]  # the decode depths measured
    points: tuple[tuple[int, float], ...]  # (depth, median ms) of every decode point, the steps' line
    ttft_ms: float
    tpot_ms_mean: float
    tpot_ms_p90: float
    e2e_ms: float
    tokens_per_s: float
    extrapolated: bool  # a step's depth lay outside the measured depths (its time held flat)


def interpolate(points: list[tuple[int, float]], depth: float) -> float:
    """The value at `depth` on the piecewise-linear line through (depth, value) `points`, held
    flat beyond the first and last."""
    pts = sorted(points)
    if depth <= pts[0][0]:
        return pts[0][1]
    for (d0, v0), (d1, v1) in zip(pts, pts[1:], strict=False):
        if depth <= d1:
            return v0 + (v1 - v0) * (depth - d0) / (d1 - d0)
    return pts[-1][1]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    s = sorted(values)
    at = (len(s) - 1) * q / 100
    lo, hi = math.floor(at), math.ceil(at)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


def step_times(points: list[tuple[int, float]], prompt: int, new_tokens: int) -> list[float]:
    """Each decode step's predicted time (ms): the N-1 steps at depths P .. P+N-2."""
    return [interpolate(points, d) for d in range(prompt, prompt + new_tokens - 1)]


def predict(prefill_ms: float, points: list[tuple[int, float]], prompt: int, new_tokens: int, batch: int = 1) -> dict[str, float]:
    """TTFT, mean and p90 TPOT, end-to-end and tokens/s of a generation of `new_tokens` after a
    prompt of `prompt`, from the prefill's median and the decode's (depth, median) points."""
    if new_tokens < 1 or not points:
        raise ValueError(f"a generation needs new_tokens >= 1 and a decode point (got {new_tokens}, {points})")
    steps = step_times(points, prompt, new_tokens)
    e2e = prefill_ms + sum(steps)
    return {
        "ttft_ms": prefill_ms,
        "tpot_ms_mean": sum(steps) / len(steps) if steps else 0.0,
        "tpot_ms_p90": percentile(steps, 90) if steps else 0.0,
        "e2e_ms": e2e,
        "tokens_per_s": batch * new_tokens / e2e * 1e3,
    }


def _int(params: dict[str, Any], key: str) -> int | None:
    try:
        return int(float(params.get(key)))
    except (TypeError, ValueError):
        return None


def _decode_points(r: dict[str, Any]) -> list[tuple[int, float]]:
    """A decode variant's (depth, median ms): its depth series, or its one call at context_len."""
    series = r["series"].get(DEPTH_MEDIAN, ())
    if len(series) >= 2:
        return [(int(d), float(v)) for d, v in series]
    ctx = _int(r["params"], CONTEXT_LEN)
    return [(ctx, r["metrics"][MEDIAN])] if ctx is not None else []


def _group(r: dict[str, Any]) -> tuple[str, ...]:
    """What a prefill and its decode share: model, backend, device, batch, and what else the name
    says beyond the phase and its lengths (dtype, quant, a captured application)."""
    base = f"{r['model']}_{r['phase']}_{r['backend']}_{r['device']}"
    rest = r["name"][len(base) :] if r["name"].startswith(base) else ""
    rest = "_".join(t for t in rest.split("_") if t and not re.fullmatch(r"(ctx|p|b)\d+", t))
    return (r["model"], r["backend"], r["device"], str(_int(r["params"], BATCH) or 1), rest)


def generations(rows: list[dict[str, Any]]) -> list[Generation]:
    """One predicted generation per ok prefill variant with ok decode variants beside it. A row is
    a prefill by its prompt_len, a decode by its context_len (no phase is named: either phase may
    be a captured call of that kind)."""
    fills: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    steps: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["status"] != "ok" or MEDIAN not in r["metrics"]:
            continue
        if _int(r["params"], CONTEXT_LEN) is not None:  # a step on a filled cache
            steps[_group(r)].append(r)
        elif _int(r["params"], PROMPT_LEN) is not None:  # a prompt into an empty cache
            fills[_group(r)].append(r)
    out = []
    for key, prefills in sorted(fills.items()):
        decodes = steps.get(key, [])
        points = sorted({pt for d in decodes for pt in _decode_points(d)})
        for pre in sorted(prefills, key=lambda r: r["name"]) if points else ():
            out += _one(pre, decodes, points)
    return out


def _one(pre: dict[str, Any], decodes: list[dict[str, Any]], points: list[tuple[int, float]]) -> list[Generation]:
    prompt = _int(pre["params"], PROMPT_LEN)
    deepest = max(d for d, _ in points)
    if prompt is None or deepest < prompt:  # the decode never reached the prompt's depth: no generation to predict
        return []
    if len({d for d, _ in points}) < 2:  # one decode depth is a point, not a generation (a default sweep's 2 tokens)
        return []
    batch = _int(pre["params"], BATCH) or 1
    new_tokens = deepest - prompt + 2
    figures = predict(pre["metrics"][MEDIAN], points, prompt, new_tokens, batch)
    depths = tuple(sorted({d for d, _ in points}))
    return [
        Generation(
            model=pre["model"], backend=pre["backend"], device=pre["device"], prefill=pre["name"],
            decode=tuple(sorted(d["name"] for d in decodes)), batch=batch, prompt=prompt,
            new_tokens=new_tokens, depths=depths, points=tuple(points), extrapolated=depths[0] > prompt, **figures,
        )
    ]


def generation_rows(gens: list[Generation]) -> list[dict[str, str]]:
    """The summary's rows: one per predicted generation."""
    return [
        {
            "model": g.model,
            "backend": f"{g.backend} {g.device}",
            "generation": f"B{g.batch} P{g.prompt} N{g.new_tokens}",
            "ttft_ms": f"{g.ttft_ms:.3f}",
            "tpot_ms_mean": f"{g.tpot_ms_mean:.3f}",
            "tpot_ms_p90": f"{g.tpot_ms_p90:.3f}",
            "e2e_ms": f"{g.e2e_ms:,.1f}",
            "tokens_per_s": f"{g.tokens_per_s:,.0f}",
            "from": f"{g.prefill} + decode at depths {','.join(map(str, g.depths))}" + (" (held flat below)" if g.extrapolated else ""),
        }
        for g in gens
    ]


def generation_text(gens: list[Generation]) -> str:
    """The summary's block, or '' when the sweep has no prefill and decode of one model and backend."""
    if not gens:
        return ""
    return f"Whole generation, predicted ({RULE})\n" + table(generation_rows(gens))


def generation_record(gens: list[Generation]) -> list[dict[str, Any]]:
    """generation.json on the sweep's run."""
    return [asdict(g) | {"rule": RULE} for g in gens]
