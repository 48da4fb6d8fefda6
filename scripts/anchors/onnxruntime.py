"""ONNX Runtime contenders for the side-by-side benchmark: one checkpoint, three ways to run it.

  phasesweep_torch   phasesweep's torch.onnx export of its swapped graph, run by its ORT session
  phasesweep_genai   onnxruntime-genai's model builder (exporter=genai), run by the same session
  genai_generator    the builder's model run by onnxruntime-genai itself (og.Model, og.Generator),
                     as a genai user runs it

Each export goes through tasks/ exactly as a sweep makes it (tasks.jobs.export_job, cached under
`work`), and each prepared call is parity-checked against transformers before it is handed out.
The caller times the calls; everything here runs at `threads` intra-op threads.

    contenders = build(Path("ckpt"), Path("work"), threads=1)
    step = contenders["phasesweep_genai"].decode(128)   # one decode step at context 128 per call
    step()
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tasks.specs import BenchOptions, BenchSpec, ExportSpec, ModelSpec, PhaseSpec

PARITY_STEPS = 8  # decode steps checked against transformers before a decode call is handed out
GENERATOR_BUDGET = 256  # tokens a generator may add before its decode call prepares a fresh one


class Contender:
    """A way of running the model: prepared zero-argument calls, each exactly one timed unit."""

    def decode(self, context_len: int) -> Callable[[], None]:
        """One decode step of one token against a cache holding `context_len` positions."""
        raise NotImplementedError

    def prefill(self, prompt_len: int) -> Callable[[], None]:
        """One prefill of a `prompt_len`-token prompt against an empty cache."""
        raise NotImplementedError


def _family(checkpoint: Path) -> str:
    from tasks.model.families import family_of

    return family_of(json.loads((checkpoint / "config.json").read_text())["model_type"])


def export_entry(work: Path, model: ModelSpec, phase: PhaseSpec, export_format: str, label: str, options: dict[str, Any]) -> Path:
    """The export entry of `phase` as a sweep makes it (tasks.jobs.export_job), made once under
    work/exports: keyed by the model, the phase, the options and the checkpoint's files."""
    from tasks.jobs import export_job

    stamp = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(model.checkpoint).iterdir())]
    key = hashlib.sha256(json.dumps([asdict(model), asdict(phase), options, stamp], default=str).encode()).hexdigest()
    out = work / "exports" / f"{label}-{key[:16]}"
    result = export_job(ExportSpec(key, model, phase, export_format, str(out), options))
    if not result.ok:
        raise RuntimeError(f"{label} export failed: {result.failure.error}\n{result.failure.traceback}")
    return out


class SweepContender(Contender):
    """phasesweep's export and ORT session, as a sweep's benchmark runs them (tasks.jobs)."""

    def __init__(self, checkpoint: Path, work: Path, threads: int, exporter: str, kv_cache: str):
        family = _family(checkpoint)
        self.model = ModelSpec(
            name=family, family=family, size="checkpoint", arch={}, checkpoint=str(checkpoint.resolve()), kv_cache=kv_cache
        )
        self.exporter, self.work, self.threads = exporter, work, threads

    def export(self, phase: PhaseSpec) -> tuple[str, BenchSpec]:
        """The export entry of this phase (made once, in work/exports) and a bench spec for it."""
        from tasks.export.onnx import Options

        options = asdict(Options(exporter=self.exporter))
        out = export_entry(self.work, self.model, phase, "onnx", f"{self.model.family}_{phase.name}_{self.exporter}", options)
        bench = BenchSpec(
            variant=out.name,
            runtime="onnxruntime",
            device="cpu",
            model=self.model,
            phase=phase,
            export_dir=str(out),
            bench=BenchOptions(threads=self.threads),
        )
        return str(out), bench

    def _call(self, phase: PhaseSpec) -> Callable[[], None]:
        from tasks.measure.parity import tolerance
        from tasks.phases import phase_module
        from tasks.runtimes import runtime_module
        from tasks.worker.entries import load_export

        out, bench = self.export(phase)
        meta, feeds, parity = load_export(out)
        session = runtime_module("onnxruntime").load(bench, meta, feeds)
        report = phase_module(phase.name).check_parity(session, phase, feeds, parity, tolerance(self.model.dtype, None))
        if not report["passed"]:
            raise RuntimeError(f"{self.exporter}: parity failed at {phase}: {report}")
        call = session.bind(feeds)

        def step() -> None:
            call()

        return step

    def decode(self, context_len: int) -> Callable[[], None]:
        return self._call(PhaseSpec("decode", batch=1, context_len=context_len, parity_steps=PARITY_STEPS))

    def prefill(self, prompt_len: int) -> Callable[[], None]:
        return self._call(PhaseSpec("prefill", batch=1, prompt_len=prompt_len))


class GeneratorContender(Contender):
    """onnxruntime-genai's own runtime on the builder's model folder (model.onnx, genai_config.json)."""

    grows = True  # each decode call adds a token: a caller timing blocks prepares it afresh per block

    def __init__(self, model_dir: str, threads: int, vocab: int, seed: int = 0):
        import onnxruntime_genai as og

        config = og.Config(model_dir)
        threads_options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": threads_options}}}))
        self.og, self.model = og, og.Model(config)
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def _generator(self, prompt: np.ndarray, max_length: int) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length, do_sample=False)
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(prompt)  # runs the model over the prompt
        return generator

    def _prompt(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.vocab, (1, n), dtype=np.int32)

    def decode(self, context_len: int) -> Callable[[], None]:
        """The context appended, its token chosen; then each call runs the model on the last
        token and chooses the next: one decode step whose context grows by one per call. After
        GENERATOR_BUDGET calls the next call first prepares a fresh generator at context_len."""
        prompt = self._prompt(context_len)
        state: dict[str, Any] = {}

        def prepare() -> None:
            state["generator"] = self._generator(prompt, context_len + GENERATOR_BUDGET + 1)
            state["generator"].generate_next_token()  # chooses from the prompt's logits: no model run
            state["left"] = GENERATOR_BUDGET

        prepare()

        def step() -> None:
            if not state["left"]:
                prepare()
            state["generator"].generate_next_token()
            state["left"] -= 1

        return step

    def prefill(self, prompt_len: int) -> Callable[[], None]:
        """Each call: a fresh generator and the prompt appended (what a genai user's prefill costs)."""
        prompt = self._prompt(prompt_len)

        def step() -> None:
            self._generator(prompt, prompt_len + 1)

        return step


def build(checkpoint: Path, work: Path, threads: int, kv_cache: str = "static") -> dict[str, Contender]:
    """The three contenders on a Hugging Face checkpoint folder (config.json + safetensors;
    tokenizer files optional). Exports are made under `work` as the first call asks for them.
    phasesweep_* use `kv_cache` (the sweep's default, static: the genai model then writes each
    step into the fixed buffer in place); genai_generator manages its own cache (on CPU it grows)."""
    checkpoint, work = Path(checkpoint), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    genai = SweepContender(checkpoint, work, threads, "genai", kv_cache)
    model_dir, _ = genai.export(PhaseSpec("prefill", batch=1, prompt_len=1))  # the builder's folder
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    return {
        "phasesweep_torch": SweepContender(checkpoint, work, threads, "torch", kv_cache),
        "phasesweep_genai": genai,
        "genai_generator": GeneratorContender(model_dir, threads, vocab),
    }
