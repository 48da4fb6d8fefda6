"""The predicted generation beside a captured application's own measured loop (phase=captured).

The capture times the application on the transformers model (tasks/phases/_capture.py); after
its variants are measured, the sweep runs it again on each backend's runtime, its forward
answered by the captured exports (tasks/app_loop.py), timed the same way, the runtime's own
calls timed apart from the rest. For each backend the table sets the generation predicted from
the benchmarks beside what the application measured on that runtime:

  TTFT, TPOT       the runtime's calls as the benchmarks timed them in the application's rhythm
                   (tasks/measure/rhythm.py: each call after the application's gap between
                   forwards; back to back where a benchmark has no such figure), plus the
                   application's own time outside the runtime's calls, measured on that runtime
                   (on transformers where it did not run there), against its TTFT and mean
                   inter-token latency
  prefill call,    the benchmarks' figure alone, against the runtime's calls inside the loop
  decode call
  outside          the application's own time outside its forward on transformers, against
                   its time outside the runtime's calls on the runtime: what carries over
  prefill hot,     the benchmarks' back-to-back medians, against the same sessions called back
  decode hot       to back after the loop (at the depth it ended on)

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.common.console import table
from orchestrator.read.generation import Generation, interpolate, predict

ARTIFACT = "captures/generation_vs_app.json"
HOT = ("hot_prefill_forward_ms_median", "hot_decode_forward_ms_median")  # tasks/app_loop.py: after the loop
CALLS = ("app_prefill_call_ms_median", "app_decode_call_ms_mean")  # tasks/app_loop.py: the runtime's own calls in the loop
RHYTHM = ("rhythm_by_gap_ms_median", "rhythm_by_gap_ms_mean")  # tasks/measure/rhythm.py series: prompt by median, steps by mean
WITHIN = 0.10  # a prediction within 10% of the measurement agrees
KEYS = ("app_ttft_ms", "app_inter_token_ms_mean", "app_prefill_forward_ms_median", "app_decode_forward_ms_mean", "app_calls")


@dataclass(frozen=True)
class AppLoop:
    """A captured application's own figures on transformers (the capture's `app_*` timings, ms)."""

    label: str  # how the sweep's run names the capture
    variants: frozenset[str]  # the variants of its kept calls
    ttft_ms: float
    inter_token_ms_mean: float
    prefill_forward_ms: float
    decode_forward_ms_mean: float
    calls: float  # forward calls of one run: batch 1, one token each, so the generation's N

    @classmethod
    def of(cls, label: str, variants: set[str], timings: dict[str, float]) -> AppLoop | None:
        """None for a capture whose timed runs recorded no decode (nothing to compare)."""
        if not all(k in timings for k in KEYS):
            return None
        return cls(label, frozenset(variants), *(float(timings[k]) for k in KEYS))

    @property
    def ttft_outside_ms(self) -> float:
        """The application's time to its first token outside the prefill's forward."""
        return self.ttft_ms - self.prefill_forward_ms

    @property
    def step_outside_ms(self) -> float:
        """The application's mean time between decode forwards outside the forward."""
        return self.inter_token_ms_mean - self.decode_forward_ms_mean


def _verdict(ratio: float) -> str:
    return f"within {WITHIN:.0%}" if abs(ratio - 1) <= WITHIN else f"{ratio - 1:+.0%}"


@dataclass(frozen=True)
class Rhythm:
    """A variant's call timed after each gap (tasks/measure/rhythm.py): (gap us, ms) points."""

    depth: int | None  # its decode depth; None for a prompt
    median: tuple[tuple[int, float], ...]
    mean: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Basis:
    """What a generation's runtime calls are predicted from: the prefill's figure and the decode's
    (depth, ms) points, in the application's rhythm at its gaps or back to back."""

    prefill_ms: float
    points: tuple[tuple[int, float], ...]
    rhythm: bool

    @classmethod
    def of(cls, g: Generation, rhythm: dict[str, Rhythm], ttft_gap_ms: float, step_gap_ms: float) -> Basis:
        """The prompt's median after `ttft_gap_ms` and each step's mean after `step_gap_ms` where
        every variant of `g` was timed in rhythm; else the back-to-back medians."""
        steps = [rhythm.get(d) for d in g.decode]
        if g.prefill not in rhythm or not steps or any(s is None or s.depth is None for s in steps):
            return cls(g.ttft_ms, g.points, False)
        prefill = interpolate(list(rhythm[g.prefill].median), ttft_gap_ms * 1e3)
        points = tuple(sorted((s.depth, interpolate(list(s.mean), step_gap_ms * 1e3)) for s in steps if s is not None and s.depth is not None))
        return cls(prefill, points, True)


def rhythms(rows: list[dict[str, Any]]) -> dict[str, Rhythm]:
    """Each ok variant of the plots' rows timed in its application's rhythm, by name."""
    out = {}
    for r in rows:
        series = r.get("series", {})
        if r.get("status") == "ok" and all(series.get(k) for k in RHYTHM):
            depth = r["params"].get("phase.context_len")
            at = int(float(depth)) if depth not in (None, "", "None") else None
            out[r["name"]] = Rhythm(at, *(tuple((int(x), float(y)) for x, y in series[k]) for k in RHYTHM))
    return out


def _outside(loop: AppLoop, measured: dict[str, float]) -> tuple[float, float]:
    """The application's own time to its first token and per step outside the runtime's calls,
    measured on the runtime; on transformers (outside its forward) where it has no such figure."""
    if all(k in measured for k in CALLS):
        return measured["app_ttft_ms"] - measured[CALLS[0]], measured["app_inter_token_ms_mean"] - measured[CALLS[1]]
    return loop.ttft_outside_ms, loop.step_outside_ms


def _pairs(g: Generation, loop: AppLoop, measured: dict[str, float], rhythm: dict[str, Rhythm]) -> dict[str, tuple[float, float]]:
    """figure -> (predicted, measured) ms, the prediction made for the application's own N."""
    ttft_out, step_out = _outside(loop, measured)
    basis = Basis.of(g, rhythm, ttft_out, step_out)
    how = "in rhythm" if basis.rhythm else "back to back"
    step = predict(basis.prefill_ms, list(basis.points), g.prompt, int(loop.calls), g.batch)["tpot_ms_mean"]
    pairs = {
        "TTFT": (basis.prefill_ms + ttft_out, measured["app_ttft_ms"]),
        "TPOT mean": (step + step_out, measured["app_inter_token_ms_mean"]),
        f"prefill call, {how}": (basis.prefill_ms, measured.get(CALLS[0], measured["app_prefill_forward_ms_median"])),
        f"decode call mean, {how}": (step, measured.get(CALLS[1], measured["app_decode_forward_ms_mean"])),
    }
    if all(k in measured for k in CALLS):  # what the application's own time on transformers says of it on the runtime
        pairs |= {"outside, to 1st token": (loop.ttft_outside_ms, ttft_out), "outside, per step": (loop.step_outside_ms, step_out)}
    if HOT[0] in measured:  # the same sessions after the loop, called back to back as a benchmark calls them
        last = interpolate(list(g.points), g.prompt + int(loop.calls) - 2)
        pairs |= {"prefill hot": (g.ttft_ms, measured[HOT[0]]), "decode hot": (last, measured[HOT[1]])}
    return pairs


def app_rows(
    gens: list[Generation], loops: list[AppLoop], on_runtime: dict[str, dict[str, float]],
    rhythm: dict[str, Rhythm] | None = None,
) -> list[dict[str, Any]]:
    """Per captured generation (`on_runtime`: its prefill variant -> the application's timings
    on that runtime; `rhythm`: rhythms() of the sweep's rows): each figure predicted and
    measured, and their ratio. A generation whose runtime loop is missing is compared with the
    application on transformers, and says so."""
    rows = []
    for loop in loops:
        for g in (g for g in gens if g.prefill in loop.variants):
            measured = on_runtime.get(g.prefill)
            ran = f"{g.backend} {g.device}" if measured else "transformers (no run on the runtime)"
            for what, (predicted, got) in _pairs(g, loop, measured or _as_timings(loop), rhythm or {}).items():
                ratio = predicted / got if got > 0 else float("nan")
                rows.append(
                    {
                        "capture": loop.label, "backend": f"{g.backend} {g.device}", "figure": what,
                        "generation": f"P{g.prompt} N{loop.calls:.0f}" + (" (deeper than measured: held flat)" if loop.calls > g.new_tokens else ""),
                        "predicted_ms": round(predicted, 4), "app_measured_ms": round(got, 4), "app_ran_on": ran,
                        "ratio": round(ratio, 3), "verdict": _verdict(ratio),
                        **({"tokens_as_on_transformers": f"{measured['tokens_agree']:.0%}"} if "tokens_agree" in (measured or {}) else {}),
                    }
                )  # fmt: skip
    return rows


def _as_timings(loop: AppLoop) -> dict[str, float]:
    figures = (loop.ttft_ms, loop.inter_token_ms_mean, loop.prefill_forward_ms, loop.decode_forward_ms_mean, loop.calls)
    return dict(zip(KEYS, figures, strict=True))


def app_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    head = (
        "Captured application: the predicted generation against the application run on each runtime (ratio = predicted / "
        f"measured, within {WITHIN:.0%} agrees). TTFT, TPOT: the runtime's calls as benchmarked (in the application's rhythm: "
        "each call after its gap between forwards) plus the application's own time outside them on that runtime; call: the "
        "benchmarks' figure against the runtime's calls in the loop; outside: on transformers against on the runtime; "
        "hot: back to back, benchmark against the loop's sessions"
    )
    return head + "\n" + table([{k: f"{v:.3f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows])
