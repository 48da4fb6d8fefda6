"""The predicted generation beside a captured application's own measured loop (phase=captured).

The capture times the application on the transformers model (tasks/phases/_capture.py); after
its variants are measured, the sweep runs it again on each backend's runtime, its forward
answered by the captured exports (tasks/app_loop.py), timed the same way. For each
backend the table sets the generation predicted from the benchmarks (orchestrator/read/
generation.py) beside what the application measured on that runtime:

  TTFT, TPOT     the prediction plus the application's own time outside its forward (measured
                 on transformers: sampling, logits processors, its loop's Python), against the
                 application's TTFT and mean inter-token latency on the runtime
  prefill fwd,   the benchmark's medians alone, against the runtime's forward inside the loop
  decode fwd
  prefill hot,   the same, against the same sessions called back to back after the loop (at the
  decode hot     depth it ended on): what the loop's own rhythm costs the forward
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.common.console import table
from orchestrator.read.generation import Generation, interpolate, predict

ARTIFACT = "captures/generation_vs_app.json"
HOT = ("hot_prefill_forward_ms_median", "hot_decode_forward_ms_median")  # tasks/app_loop.py: after the loop
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


def _pairs(g: Generation, loop: AppLoop, measured: dict[str, float]) -> dict[str, tuple[float, float]]:
    """figure -> (predicted, measured) ms, the prediction made for the application's own N."""
    tpot = predict(g.ttft_ms, list(g.points), g.prompt, int(loop.calls), g.batch)["tpot_ms_mean"]
    pairs = {
        "TTFT": (g.ttft_ms + loop.ttft_outside_ms, measured["app_ttft_ms"]),
        "TPOT mean": (tpot + loop.step_outside_ms, measured["app_inter_token_ms_mean"]),
        "prefill fwd": (g.ttft_ms, measured["app_prefill_forward_ms_median"]),
        "decode fwd mean": (tpot, measured["app_decode_forward_ms_mean"]),
    }
    if HOT[0] in measured:  # the same sessions after the loop, called back to back as a benchmark calls them
        last = interpolate(list(g.points), g.prompt + int(loop.calls) - 2)
        pairs |= {"prefill hot": (g.ttft_ms, measured[HOT[0]]), "decode hot": (last, measured[HOT[1]])}
    return pairs


def app_rows(gens: list[Generation], loops: list[AppLoop], on_runtime: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Per captured generation (`on_runtime`: its prefill variant -> the application's timings
    on that runtime): each figure predicted and measured, and their ratio. A generation whose
    runtime loop is missing is compared with the application on transformers, and says so."""
    rows = []
    for loop in loops:
        for g in (g for g in gens if g.prefill in loop.variants):
            measured = on_runtime.get(g.prefill)
            ran = f"{g.backend} {g.device}" if measured else "transformers (no run on the runtime)"
            for what, (predicted, got) in _pairs(g, loop, measured or _as_timings(loop)).items():
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
        f"measured, within {WITHIN:.0%} agrees). TTFT, TPOT: the prediction plus the application's own time outside its "
        "forward (measured on transformers); fwd: the benchmark's medians against the runtime's forward in the loop"
    )
    return head + "\n" + table([{k: f"{v:.3f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows])
