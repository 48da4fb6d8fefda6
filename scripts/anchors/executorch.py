"""ExecuTorch side by side: phasesweep's best ExecuTorch program against ExecuTorch's own LLM export.

build() returns two contenders of the same architecture:

- "phasesweep": the transformers checkpoint exported through tasks/ with the cache in the graph
  (model.kv_cache=update_cache, model.attention=custom_sdpa), every op XNNPACK takes delegated;
- "phasesweep_linear": the same with backend.export_options.delegate=xnnpack_linear (only the
  linear layers in XNNPACK, as export_llama -X delegates);
- "export_llama": `python -m executorch.examples.models.llama.export_llama -p params.json -kv
  --use_sdpa_with_kv_cache -X` (random weights), written into `work`.

Both are exported in child processes: what an export leaves in a process (its freed heap, its
threads, its objects) must not fall on one contender only.

Each is one program whose forward takes tokens [1, S] (S dynamic) and a position, and keeps its
KV cache as mutable buffers: prefill is one call of S tokens at position 0, decode one call of
one token after the cache was filled with the context by one call. Every prepared callable has
its own loaded method, so its cache is its own. Both run at `threads` XNNPACK threads (one pool
per process: the last build() sets it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MAX_SEQ_LEN = 1024  # cache slots of both programs; prefill up to MAX_SEQ_LEN - 1 tokens
LLAMA_EXPORT = "executorch.examples.models.llama.export_llama"
PHASESWEEP = {"phasesweep": "xnnpack", "phasesweep_linear": "xnnpack_linear"}  # contender: its delegate
ROOT = Path(__file__).resolve().parents[2]  # the repository: the child export imports tasks/ from it


class Contender:
    """One .pte; `positions(start, n)` is its position input for n tokens from `start`."""

    def __init__(self, name: str, path: Path, vocab: int, positions: Callable[[int, int], Any], max_len: int = MAX_SEQ_LEN):
        from executorch.runtime import Runtime

        self.name, self.path, self.vocab, self.positions, self.max_len = name, path, vocab, positions, max_len
        self.program = Runtime.get().load_program(path)

    def _tokens(self, n: int, seed: int) -> Any:
        import torch

        return torch.randint(0, self.vocab, (1, n), generator=torch.Generator().manual_seed(seed))

    def _call(self, method: Any, tokens: Any, start: int) -> Callable[[], None]:
        inputs = [tokens, self.positions(start, tokens.shape[1])]
        return lambda: method.execute(inputs)

    def decode(self, context_len: int) -> Callable[[], None]:
        """One token at position context_len, on a cache filled with context_len tokens."""
        _check_len(context_len + 1, self.max_len)
        method = self.program.load_method("forward")
        self._call(method, self._tokens(context_len, 0), 0)()  # fill the cache through the program
        return self._call(method, self._tokens(1, 1), context_len)

    def prefill(self, prompt_len: int) -> Callable[[], None]:
        """prompt_len tokens at position 0 (repeating it rewrites the same slots)."""
        _check_len(prompt_len, self.max_len - 1)
        return self._call(self.program.load_method("forward"), self._tokens(prompt_len, 2), 0)


def _check_len(n: int, most: int) -> None:
    if not 1 <= n <= most:
        raise ValueError(f"{n} positions: these programs hold 1 to {most} (build's max_len)")


def _threads(threads: int) -> None:
    from executorch.extension.pybindings import portable_lib

    from tasks.runtimes.executorch import threadpool

    threadpool(portable_lib, "_unsafe_reset_threadpool")(threads)
    got = threadpool(portable_lib, "_threadpool_get_thread_count")()
    if got != threads:
        raise RuntimeError(f"XNNPACK's thread pool has {got} threads, {threads} asked")


def export_phasesweep(
    checkpoint: Path, work: Path, max_len: int = MAX_SEQ_LEN, delegate: str = "xnnpack"
) -> tuple[Path, int]:
    """The checkpoint through tasks/ in a child process, as export_llama's own export runs: the
    measuring process then holds the two programs and nothing an export leaves behind."""
    code = "import json, sys; from scripts.anchors.executorch import export_here; print(json.dumps(export_here(*sys.argv[1:])))"
    args = [str(checkpoint), str(work), str(max_len), delegate]
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"phasesweep export failed ({done.returncode}):\n{done.stderr[-4000:]}")
    path, vocab = json.loads(done.stdout.strip().splitlines()[-1])
    return Path(path), vocab


def export_here(checkpoint: str, work: str, max_len: str, delegate: str) -> tuple[str, int]:
    """export_job (build, reference data, export) in this process: the .pte's path, the vocab."""
    from tasks.jobs import export_job
    from tasks.model.families import family_of
    from tasks.specs import ExportSpec, ModelSpec, PhaseSpec

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    family = family_of(config["model_type"])
    model = ModelSpec(
        name=family, family=family, size="checkpoint", arch={}, checkpoint=str(checkpoint),
        dtype="float32", kv_cache="update_cache", attention="custom_sdpa",
    )  # fmt: skip
    phase = PhaseSpec("decode", batch=1, context_len=8, cache_len=int(max_len), parity_steps=8)
    out = Path(work) / f"phasesweep-{delegate}-{max_len}"
    result = export_job(ExportSpec("anchor", model, phase, "executorch", str(out), {"delegate": delegate}))
    if not result.ok:
        raise RuntimeError(f"phasesweep export failed: {result.failure.error}\n{result.failure.traceback}")
    return str(out / result.artifact), config["vocab_size"]


def export_llama(params_json: Path, work: Path, max_len: int = MAX_SEQ_LEN) -> Path:
    """ExecuTorch's own LLM export (random weights), reused when made with the same arguments."""
    name = "export_llama.pte"
    args = [
        "-p", str(params_json), "-kv", "--use_sdpa_with_kv_cache", "-X",
        "--max_seq_length", str(max_len), "--max_context_length", str(max_len),
        "-o", str(work), "--output_name", name,
    ]  # fmt: skip
    stamp = Path(work) / "export_llama.args.json"
    made = {"args": args, "params": json.loads(Path(params_json).read_text())}
    path = Path(work) / name
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == made:
        return path
    Path(work).mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", LLAMA_EXPORT, *args], cwd=work, capture_output=True, text=True)
    if done.returncode or not path.exists():
        raise RuntimeError(f"export_llama failed ({done.returncode}):\n{done.stderr[-4000:]}")
    stamp.write_text(json.dumps(made))
    return path


def build(checkpoint: Path, params_json: Path, work: Path, threads: int, max_len: int = MAX_SEQ_LEN) -> dict[str, Contender]:
    import torch

    from tasks.model.sdpa import load_llama_ops

    load_llama_ops()  # both programs use llama::update_cache and llama::custom_sdpa
    work = Path(work)
    ours = {name: export_phasesweep(checkpoint, work, max_len, delegate) for name, delegate in PHASESWEEP.items()}
    theirs = export_llama(params_json, work, max_len)
    vocab = next(iter(ours.values()))[1]
    their_vocab = json.loads(Path(params_json).read_text()).get("vocab_size", vocab)
    _threads(threads)
    positions = lambda start, n: torch.arange(start, start + n)  # noqa: E731
    return {
        **{name: Contender(name, path, vocab, positions, max_len) for name, (path, vocab) in ours.items()},
        "export_llama": Contender("export_llama", theirs, their_vocab, lambda start, n: torch.tensor([start]), max_len),
    }


def _interleaved(calls: dict[str, Callable[[], None]], rounds: int, per_round: int) -> dict[str, float]:
    """Median ms of each call, timed in alternating blocks (order flipped each round), so a
    machine that changes speed affects every contender alike."""
    import time

    samples: dict[str, list[int]] = {name: [] for name in calls}
    for call in calls.values():  # warm up
        call()
    for r in range(rounds):
        for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
            call = calls[name]
            for _ in range(per_round):
                t0 = time.perf_counter_ns()
                call()
                samples[name].append(time.perf_counter_ns() - t0)
    return {name: float(np.median(ns)) / 1e6 for name, ns in samples.items()}


def main() -> None:
    """Standalone check on a small Llama (hidden 256, 4 layers): per-token medians at one context."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="reuses the exports already there")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=30)
    a = parser.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="anchor-et-"))
    checkpoint, params = (work / "checkpoint", work / "params.json") if (work / "params.json").exists() else small_llama(work)
    contenders = build(checkpoint, params, work, a.threads)
    decode = _interleaved({n: c.decode(a.context) for n, c in contenders.items()}, a.rounds, 20)
    prefill = _interleaved({n: c.prefill(a.prompt) for n, c in contenders.items()}, a.rounds, 1)
    for name in contenders:
        print(f"{name:13s} decode ctx{a.context}: {decode[name]:.3f} ms/token   prefill p{a.prompt}: {prefill[name]:.2f} ms")
    ours, theirs = "phasesweep", "export_llama"
    print(f"{ours}/{theirs}: decode {decode[ours] / decode[theirs]:.3f}x, prefill {prefill[ours] / prefill[theirs]:.3f}x")


def small_llama(work: Path, hidden: int = 256, layers: int = 4, heads: int = 8, kv_heads: int = 2, vocab: int = 32000):
    """A random Llama checkpoint (save_pretrained) and the params.json of the same architecture."""
    import torch
    import transformers

    ffn = 4 * hidden
    config = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=2 * MAX_SEQ_LEN,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    checkpoint = Path(work) / "checkpoint"
    transformers.LlamaForCausalLM(config).save_pretrained(checkpoint)
    params = {
        "dim": hidden, "n_layers": layers, "n_heads": heads, "n_kv_heads": kv_heads, "vocab_size": vocab,
        "hidden_dim": ffn, "norm_eps": 1e-5, "rope_theta": 10000.0, "use_hf_rope": False,
    }  # fmt: skip
    path = Path(work) / "params.json"
    path.write_text(json.dumps(params))
    return checkpoint, path


if __name__ == "__main__":
    main()
