"""OpenVINO contenders for the side-by-side benchmark: one stateful IR (optimum-intel's export,
tasks/export/openvino_ir.py), run three ways.

  phasesweep          phasesweep's stateful session (tasks/runtimes/openvino_stateful.py) as a
                      sweep's benchmark runs it: calls at depths C..C+15, the state refilled by a
                      prefill of the context every 16 calls, untimed (the caller runs the call's
                      `rewind` before its clock)
  phasesweep_growing  a session's request stepped by hand, nothing refilled: each call appends its
                      token to the state (depth C, C+1, ...), as a generation does; a fresh session
                      every round (`grows`)
  genai_pipeline      openvino_genai.LLMPipeline on the same folder (the IR, its tokenizer's IR),
                      with the same plugin settings (CPU pinning off on both: SETTINGS) and the
                      SDPA attention backend (the stateful IR as exported; its default on CPU
                      rebuilds the model with PagedAttention);
                      it times itself: a greedy generation of n + 2 tokens after the context, its
                      per-token durations (raw_metrics.m_durations: every token after the first)
                      without the first step after the prompt; a prefill is its time to first
                      token (it samples and emits that token too). Its times include what a
                      generation does per token besides the model (sampling, the streamer's check)

Needs openvino-genai==2026.4.1.0 and openvino-tokenizers==2026.4.1.0 importable (they pin the
openvino the project pins). The export makes the tokenizer's IR offline: a random-weight
checkpoint gets a word-level tokenizer over its ids (tasks/export/_genai.py write_tokenizer).

    contenders = build(Path("ckpt"), Path("work"), threads=2)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scripts.anchors.llamacpp import ProcessTimed
from scripts.anchors.onnxruntime import PARITY_STEPS, Contender, export_entry
from tasks.specs import BenchOptions, BenchSpec, ModelSpec, PhaseSpec

# the session's auto for float32, named; and CPU pinning off: with it on, the two compiled models in
# this process pin their stream threads in compile order and whichever is pinned later runs slower
SETTINGS = {"kv_cache_precision": "f32", "cpu_pinning": False}


class SweepContender(Contender):
    """phasesweep's IR and stateful session, as a sweep's benchmark runs them (tasks.jobs)."""

    def __init__(self, checkpoint: Path, work: Path, threads: int, quant: str, growing: bool = False):
        self.model = ModelSpec(
            name="llama", family="llama", size="checkpoint", arch={}, checkpoint=str(checkpoint.resolve()), quant=quant
        )
        self.work, self.threads, self.growing = work, threads, growing
        self.grows = growing

    def export(self, phase: PhaseSpec) -> tuple[str, BenchSpec]:
        """The export entry of this phase (made once, in work/exports) and a bench spec for it."""

        out = export_entry(self.work, self.model, phase, "openvino_ir", f"ir_{phase.name}_{self.model.quant}", {})
        bench = BenchSpec(
            out.name, "openvino_stateful", "cpu", self.model, phase, str(out), bench=BenchOptions(threads=self.threads), runtime_options=SETTINGS
        )
        return str(out), bench

    def session(self, phase: PhaseSpec) -> tuple[Any, dict[str, np.ndarray]]:
        """The session, parity-checked against transformers first, and the phase's feeds."""
        from tasks.measure.parity import quantized, tolerance
        from tasks.phases import phase_module
        from tasks.runtimes import runtime_module
        from tasks.worker.entries import load_export

        out, bench = self.export(phase)
        meta, feeds, parity = load_export(out)
        session = runtime_module("openvino_stateful").load(bench, meta, feeds)
        report = phase_module(phase.name).check_parity(session, phase, feeds, parity, tolerance("float32", None))
        if self.model.quant != "none":
            report = quantized(report, self.model.quant)
        if not report["passed"]:
            raise RuntimeError(f"openvino_stateful: parity failed at {phase}: {report}")
        return session, feeds

    def decode(self, context_len: int) -> Callable[[], None]:
        session, feeds = self.session(PhaseSpec("decode", batch=1, context_len=context_len, parity_steps=PARITY_STEPS))
        if not self.growing:
            return session.bind(feeds)  # a Bound: the caller rewinds it, untimed, before each call
        engine = session.engine
        inputs = engine.prepare(feeds)  # the context in the state
        ids, position = np.asarray(inputs["input_ids"]), [context_len]

        def step() -> None:  # the next position each call: the state grows by one
            engine.request.start_async(engine.feeds(ids, position[0]), share_inputs=True)  # as the session's call
            engine.request.wait()
            position[0] += 1

        return step

    def prefill(self, prompt_len: int) -> Callable[[], None]:
        session, feeds = self.session(PhaseSpec("prefill", batch=1, prompt_len=prompt_len))
        return session.bind(feeds)


class PipelineContender(Contender):
    """openvino_genai.LLMPipeline on the folder phasesweep's decode export made (IR + tokenizer IR)."""

    def __init__(self, ours: SweepContender, threads: int, vocab: int, seed: int = 0):
        self.ours, self.threads, self.vocab = ours, threads, vocab
        self.rng = np.random.default_rng(seed)
        self.pipes: dict[str, Any] = {}

    def _pipe(self, phase: PhaseSpec) -> Any:
        import openvino_genai as og

        out, _ = self.ours.export(phase)
        if out not in self.pipes:
            settings = {
                "ATTENTION_BACKEND": "SDPA",
                "INFERENCE_NUM_THREADS": self.threads,
                "INFERENCE_PRECISION_HINT": "f32",
                "KV_CACHE_PRECISION": "f32",
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32 if self.ours.model.quant == "8da4w" else 0,
                "PERFORMANCE_HINT": "LATENCY",
                "NUM_STREAMS": 1,
                "ENABLE_CPU_PINNING": SETTINGS["cpu_pinning"],
            }
            self.pipes[out] = og.LLMPipeline(out, "CPU", **settings)
        return self.pipes[out]

    def _timed(self, phase: PhaseSpec, length: int, new_tokens: Callable[[int], int], pick: Callable[[Any, int], list[float]]) -> ProcessTimed:
        import openvino as ov
        import openvino_genai as og

        pipe = self._pipe(phase)
        ids = self.rng.integers(3, self.vocab, (1, length), dtype=np.int64)
        prompt = og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))

        def block(n: int) -> list[float]:
            config = og.GenerationConfig(max_new_tokens=new_tokens(n), min_new_tokens=new_tokens(n), do_sample=False)
            config.ignore_eos = True
            return pick(lambda: pipe.generate(prompt, config), n)

        return ProcessTimed(block)

    def decode(self, context_len: int) -> ProcessTimed:  # type: ignore[override]
        def per_token(generate: Callable[[], Any], n: int) -> list[float]:
            # us per token after the first (whose time is the prompt's); the first of these, the first
            # step after the prompt, came out several times the others (1.9 ms against 0.2 on the tiny model): left out
            durations = list(generate().perf_metrics.raw_metrics.m_durations)
            return [d / 1e3 for d in durations[1 : n + 1]]

        phase = PhaseSpec("decode", batch=1, context_len=context_len, parity_steps=PARITY_STEPS)
        return self._timed(phase, context_len, lambda n: n + 2, per_token)

    def prefill(self, prompt_len: int) -> ProcessTimed:  # type: ignore[override]
        def first_token(generate: Callable[[], Any], n: int) -> list[float]:
            return [generate().perf_metrics.get_ttft().mean for _ in range(n)]  # ms

        return self._timed(PhaseSpec("prefill", batch=1, prompt_len=prompt_len), prompt_len, lambda n: 1, first_token)


def build(checkpoint: Path, work: Path, threads: int, quant: str = "none") -> dict[str, Contender]:
    checkpoint, work = Path(checkpoint), Path(work)
    ours = SweepContender(checkpoint, work, threads, quant)
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    return {
        "phasesweep": ours,
        "phasesweep_growing": SweepContender(checkpoint, work, threads, quant, growing=True),
        "genai_pipeline": PipelineContender(ours, threads, vocab),
    }
