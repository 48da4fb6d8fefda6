"""The predicted generation beside a captured application's own measured loop (phase=captured):
for each backend, its predicted TTFT and mean time per output token (orchestrator/read/
generation.py, from the captured prefill and decode variants) against the application's
measured TTFT and mean inter-token latency, and their ratio.

The application runs the float transformers model in PyTorch (tasks/phases/_capture.py), so its
figures are those of that loop: its forward plus what it does between forwards (sampling,
logits processors, cache handling). The table shows both parts, so a prediction is read
against a measurement of the same thing: `fwd` rows compare the benchmarked forward with the
application's own forward, `loop` rows add the application's measured time outside its forward
to the prediction and compare it with what the application felt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.common.console import table
from orchestrator.read.generation import Generation

ARTIFACT = "captures/generation_vs_app.json"
WITHIN = 0.10  # a prediction within 10% of the measurement agrees


@dataclass(frozen=True)
class AppLoop:
    """A captured application's own figures (the capture's `app_*` timings, ms)."""

    label: str  # how the sweep's run names the capture
    variants: frozenset[str]  # the variants of its kept calls
    ttft_ms: float
    inter_token_ms_mean: float
    prefill_forward_ms: float
    decode_forward_ms_mean: float

    @classmethod
    def of(cls, label: str, variants: set[str], timings: dict[str, float]) -> AppLoop | None:
        """None for a capture whose timed runs recorded no decode (nothing to compare)."""
        keys = ("app_ttft_ms", "app_inter_token_ms_mean", "app_prefill_forward_ms_median", "app_decode_forward_ms_mean")
        if not all(k in timings for k in keys):
            return None
        return cls(label, frozenset(variants), *(float(timings[k]) for k in keys))

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


def app_rows(gens: list[Generation], loops: list[AppLoop]) -> list[dict[str, Any]]:
    """Per captured generation: TTFT and TPOT predicted and measured, forward alone and whole loop."""
    rows = []
    for loop in loops:
        for g in gens:
            if g.prefill not in loop.variants:
                continue
            pairs = {
                "TTFT fwd": (g.ttft_ms, loop.prefill_forward_ms),
                "TPOT fwd": (g.tpot_ms_mean, loop.decode_forward_ms_mean),
                "TTFT loop": (g.ttft_ms + loop.ttft_outside_ms, loop.ttft_ms),
                "TPOT loop": (g.tpot_ms_mean + loop.step_outside_ms, loop.inter_token_ms_mean),
            }
            for what, (predicted, measured) in pairs.items():
                ratio = predicted / measured if measured > 0 else float("nan")
                rows.append(
                    {
                        "capture": loop.label,
                        "backend": f"{g.backend} {g.device}",
                        "figure": what,
                        "predicted_ms": round(predicted, 4),
                        "app_measured_ms": round(measured, 4),
                        "ratio": round(ratio, 3),
                        "verdict": _verdict(ratio),
                    }
                )
    return rows


def app_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    head = (
        "Captured application: predicted generation against its own measured loop (ratio = predicted / measured). "
        "The application ran the transformers model in PyTorch: on another runtime the ratio is that runtime's gain. fwd: the benchmark's forward against the application's forward "
        "(transformers in PyTorch); loop: plus the application's measured time outside its forward"
    )
    return head + "\n" + table([{k: f"{v:.3f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows])
