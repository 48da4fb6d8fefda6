"""phasesweep's best export per runtime against that runtime's own LLM exporter, interleaved.

A benchmark, not a test. One Llama-architecture checkpoint (random seeded weights, about
125M parameters by default) is written with save_pretrained, then each runtime's anchor
module (scripts/anchors/) exports it twice or more: with phasesweep's paths and with the
runtime's own exporter (ONNX Runtime GenAI's model builder and generator; ExecuTorch's
export_llama with its custom ops and XNNPACK; for llama.cpp, phasesweep's GGUF run by its
session against llama.cpp's own llama-bench on the same file, which times its own calls; for
OpenVINO, optimum-intel's stateful IR run by phasesweep's session against
openvino_genai.LLMPipeline's own per-token times on the same IR). Every contender then runs the same calls,
interleaved: each round visits the contenders in a fresh random order and times a short
block of calls of each, so a change of machine speed falls on all of them alike. The
ratio of each contender to the runtime's own export is the median of the per-round ratios
of block medians, with a bootstrap 95% interval.

    pip install -e '.[genai]'          # the anchors' packages (onnxruntime-genai)
    python scripts/bench_vs_runtime_exporters.py                       # both runtimes
    python scripts/bench_vs_runtime_exporters.py --runtimes executorch --contexts 128 --rounds 10
    python scripts/bench_vs_runtime_exporters.py --json figures.json   # the figures, for the docs
    pip install -e '.[llamacpp]' && python scripts/bench_vs_runtime_exporters.py --runtimes llamacpp --quant none,int4
    pip install openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0   # beside '.[openvino]'
    python scripts/bench_vs_runtime_exporters.py --runtimes openvino --quant none,int4
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.anchors.llamacpp import ProcessTimed  # noqa: E402  (after the repository is on the path)

# the 125M Llama-architecture model: 12 layers, hidden 768, 12 heads, 4 KV heads
ARCH = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
# each runtime's own exporter or tool
ANCHORS = {"onnxruntime": "genai_generator", "executorch": "export_llama", "llamacpp": "llama_bench", "openvino": "genai_pipeline"}
QUANTISED = ("llamacpp", "openvino")  # the runtimes --quant applies to


def write_checkpoint(folder: Path, arch: dict, seed: int) -> tuple[Path, Path]:
    """The transformers checkpoint and the same architecture as ExecuTorch's params.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    ckpt, stamp = folder / "checkpoint", folder / "checkpoint.arch.json"
    made = json.dumps({"arch": arch, "seed": seed}, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == made:  # kept from an earlier run (--work): its exports too
        print(f"checkpoint: reused {ckpt}")
        return ckpt, folder / "params.json"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**arch)).eval()
    model.save_pretrained(ckpt)
    params = {
        "dim": arch["hidden_size"],
        "hidden_dim": arch["intermediate_size"],
        "n_layers": arch["num_hidden_layers"],
        "n_heads": arch["num_attention_heads"],
        "n_kv_heads": arch["num_key_value_heads"],
        "head_dim": arch["head_dim"],
        "vocab_size": arch["vocab_size"],
        "norm_eps": arch["rms_norm_eps"],
        "rope_theta": 10000.0,
        "use_scaled_rope": False,
    }
    params_json = folder / "params.json"
    params_json.write_text(json.dumps(params))
    stamp.write_text(made)
    print(f"checkpoint: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {ckpt}")
    return ckpt, params_json


def build(runtime: str, ckpt: Path, params_json: Path, work: Path, threads: int, max_len: int, quant: str) -> dict:
    module = importlib.import_module(f"scripts.anchors.{runtime}")  # their own exports live in `work`
    folder = work / f"{runtime}-anchors"  # a cwd ending in "executorch" changes what export_llama imports
    folder.mkdir(exist_ok=True)
    if runtime == "executorch":
        return module.build(ckpt, params_json, folder, threads, max_len=max_len)
    if runtime in QUANTISED:
        return module.build(ckpt, folder, threads, quant=quant)
    return module.build(ckpt, folder, threads)


def interleaved(
    prepare: dict[str, Callable[[], Callable[[], None]]], grows: set[str], rounds: int, block: int, warmup: int, seed: int
) -> dict[str, list[float]]:
    """Per contender, the median call time (ms) of each round's block. Each call is prepared
    once, untimed; a contender whose state advances per call (`grows`: a generator's context)
    afresh every round, so each of its blocks starts at the same context. A call with a
    `rewind` (a stateful session's: its state set back to the call's depth) is rewound before
    each timed call, outside the clock, as the sweep's timer does."""
    rng = random.Random(seed)
    medians: dict[str, list[float]] = {name: [] for name in prepare}
    calls = {name: prep() for name, prep in prepare.items()}
    for r in range(rounds):
        order = list(prepare)
        rng.shuffle(order)
        for name in order:
            call = prepare[name]() if name in grows and r else calls[name]
            if isinstance(call, ProcessTimed):  # a tool that times its own calls (llama-bench, its own warm-up)
                medians[name].append(statistics.median(call.block(block)))
                continue
            for _ in range(warmup):
                getattr(call, "rewind", lambda: None)()
                call()
            times = []
            rewind = getattr(call, "rewind", lambda: None)
            for _ in range(block):
                rewind()
                t0 = time.perf_counter_ns()
                call()
                times.append((time.perf_counter_ns() - t0) / 1e6)
            medians[name].append(statistics.median(times))
    return medians


def paired_ratio(a: list[float], b: list[float], seed: int, resamples: int = 2000) -> tuple[float, float, float]:
    """Median of the per-round ratios a/b, with a bootstrap 95% interval over rounds."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return statistics.median(ratios), boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1]


def measure(contenders: dict, runtime: str, what: str, length: int, args, quant: str = "none") -> list[dict]:
    anchor = ANCHORS[runtime]
    method = "decode" if what == "decode" else "prefill"
    prepare = {name: (lambda c=c: getattr(c, method)(length)) for name, c in contenders.items()}
    grows = {name for name, c in contenders.items() if getattr(c, "grows", False) and method == "decode"}
    medians = interleaved(prepare, grows, args.rounds, args.block, args.warmup, args.seed)
    rows = []
    for name, values in medians.items():
        ratio, low, high = paired_ratio(values, medians[anchor], args.seed)
        per_token = statistics.median(values) / (length if what == "prefill" else 1)
        rows.append(
            {
                "runtime": runtime,
                "measure": f"{what}@{length}" + (f" {quant}" if quant != "none" else ""),
                "contender": name,
                "median_ms": statistics.median(values),
                "ms_per_token": per_token,
                "ratio_to_anchor": ratio,
                "ratio_low": low,
                "ratio_high": high,
            }
        )
    return rows


def report(rows: list[dict], runtime: str | None = None) -> None:
    """The table of `rows` (of one runtime, as soon as it is measured; else all of them)."""
    print(f"\n{'runtime':<12} {'measure':<12} {'contender':<18} {'ms/token':>9} {'x anchor':>9}  95% interval", flush=True)
    for r in rows:
        if runtime in (None, r["runtime"]):
            print(
                f"{r['runtime']:<12} {r['measure']:<12} {r['contender']:<18} {r['ms_per_token']:>9.3f} "
                f"{r['ratio_to_anchor']:>9.3f}  [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtimes", default="onnxruntime,executorch", help="comma-separated: onnxruntime, executorch, llamacpp, openvino")
    p.add_argument("--quant", default="none", help="llamacpp, openvino: comma-separated model.quant values (none, int8, int4; q4_k_m: llamacpp)")
    p.add_argument("--contexts", default="128,1024", help="decode context lengths")
    p.add_argument("--prompt", type=int, default=128, help="prefill prompt length (0: no prefill)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every contender")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per measurement")
    p.add_argument("--block", type=int, default=8, help="timed calls per contender per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before each block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=ARCH["num_hidden_layers"], help="override the layer count")
    p.add_argument("--work", type=Path, default=None, help="keep the checkpoint and exports here")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = [r for r in runtimes if r not in ANCHORS]
    if unknown:
        p.error(f"--runtimes: {', '.join(unknown)} unknown; choose from {', '.join(ANCHORS)}")
    contexts = [int(c) for c in args.contexts.split(",") if c]
    arch = {**ARCH, "num_hidden_layers": args.layers}
    max_len = max(contexts + [args.prompt]) + 64

    with tempfile.TemporaryDirectory(prefix="phasesweep-anchors-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt, params_json = write_checkpoint(work, arch, args.seed)
        rows: list[dict] = []
        for runtime, quant in [(r, q) for r in runtimes for q in (args.quant.split(",") if r in QUANTISED else ["none"])]:
            t0 = time.perf_counter()
            contenders = build(runtime, ckpt, params_json, work, args.threads, max_len, quant)
            print(f"{runtime}: built {', '.join(contenders)} in {time.perf_counter() - t0:.0f} s")
            for ctx in contexts:
                rows += measure(contenders, runtime, "decode", ctx, args, quant)
            if args.prompt:
                rows += measure(contenders, runtime, "prefill", args.prompt, args, quant)
            del contenders
            report(rows, runtime)

    report(rows)
    if args.json:
        conditions = {"arch": arch, "threads": args.threads, "rounds": args.rounds, "block": args.block}
        args.json.write_text(json.dumps({"conditions": conditions, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
