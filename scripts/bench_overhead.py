"""How much does phasesweep's harness add to a decode step? A benchmark, not a test.

On the same exported tiny decode model, time a bare hand-written loop (ONNX Runtime with
IOBinding; ExecuTorch Method.execute) and phasesweep's harness (tasks/runtimes + the
measurement loop of tasks/bench.py) in one process, interleaved in alternating blocks so
drift and noise hit both alike, and print the ratio of medians (harness / bare).

    python scripts/bench_overhead.py                     # both backends
    python scripts/bench_overhead.py --backend onnxruntime --rounds 30 --calls 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks.bench import measure  # noqa: E402
from tasks.jobs import export_job, load_export  # noqa: E402
from tasks.runtimes import runtime_module  # noqa: E402
from tasks.specs import BenchOptions, BenchSpec, ExportSpec, ModelSpec, PhaseSpec  # noqa: E402

FORMATS = {"onnxruntime": "onnx", "executorch": "executorch"}


def tiny_model(name: str) -> ModelSpec:
    cfg = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    return ModelSpec(name=name, family=cfg["family"], size="tiny", arch=cfg["sizes"]["tiny"])


# The two bare loops are written out on purpose: they are the reference the harness is
# compared with, so they carry no abstraction of their own.
def bare_onnxruntime(path: Path, feeds: dict[str, np.ndarray], threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    for name, arr in feeds.items():
        binding.bind_cpu_input(name, arr)
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")

    def block(n: int) -> list[int]:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            sess.run_with_iobinding(binding)
            samples.append(time.perf_counter_ns() - t0)
        return samples

    return block


def bare_executorch(path: Path, feeds: dict[str, np.ndarray], threads: int):
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    portable_lib._unsafe_reset_threadpool(threads)
    method = Runtime.get().load_program(path).load_method("forward")
    inputs = [torch.from_numpy(np.ascontiguousarray(a)) for a in feeds.values()]

    def block(n: int) -> list[int]:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            method.execute(inputs)
            samples.append(time.perf_counter_ns() - t0)
        return samples

    return block


def harness(backend: str, spec: BenchSpec, meta: dict, feeds: dict[str, np.ndarray]):
    session = runtime_module(backend).load(spec, meta, feeds)
    call = session.bind(feeds)

    def block(n: int) -> list[int]:
        opts = BenchOptions(warmup_iters=1, warmup_max_seconds=0.0, min_iters=n, max_iters=n, min_seconds=0.0)
        return measure(call, opts, session.sync).samples_ns

    return block


def compare(backend: str, args, work: Path) -> dict[str, float]:
    model = tiny_model(args.model)
    phase = PhaseSpec("decode", batch=1, context_len=args.context_len, parity_steps=8)
    export = export_job(ExportSpec(f"overhead-{backend}", model, phase, FORMATS[backend], str(work / backend)))
    if not export.ok:
        raise SystemExit(f"export failed: {export.failure.error}\n{export.failure.traceback}")
    out = Path(export.out_dir)
    meta, feeds, _ = load_export(out)
    spec = BenchSpec(
        "overhead", backend, "cpu", model, phase, str(out), str(work / "bench"), BenchOptions(threads=args.threads)
    )
    bare = (bare_onnxruntime if backend == "onnxruntime" else bare_executorch)(
        out / meta["artifact"], feeds, args.threads
    )
    ours = harness(backend, spec, meta, feeds)
    bare(args.calls), ours(args.calls)  # warm both
    b_all, h_all, ratios = [], [], []
    for r in range(args.rounds):  # alternate which goes first
        first, second = (bare, ours) if r % 2 == 0 else (ours, bare)
        s1, s2 = first(args.calls), second(args.calls)
        b, h = (s1, s2) if r % 2 == 0 else (s2, s1)
        b_all += b
        h_all += h
        ratios.append(np.median(h) / np.median(b))
    bare_med, ours_med = float(np.median(b_all)) / 1e3, float(np.median(h_all)) / 1e3
    return {
        "bare_median_us": bare_med,
        "harness_median_us": ours_med,
        "ratio_of_medians": ours_med / bare_med,
        "median_of_round_ratios": float(np.median(ratios)),
        "samples_each": len(b_all),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["onnxruntime", "executorch", "both"], default="both")
    p.add_argument("--model", default="llama")
    p.add_argument("--context-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    backends = ["onnxruntime", "executorch"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory() as tmp:
        rows = {b: compare(b, args, Path(tmp)) for b in backends}
    print(
        f"\n{args.model} decode, context {args.context_len}, {args.threads} thread(s), "
        f"{args.rounds} interleaved rounds x {args.calls} calls"
    )
    print(f"{'backend':<12} {'bare us':>9} {'harness us':>11} {'ratio':>7} {'round ratio':>12}")
    for b, r in rows.items():
        print(
            f"{b:<12} {r['bare_median_us']:9.1f} {r['harness_median_us']:11.1f} "
            f"{r['ratio_of_medians']:7.3f} {r['median_of_round_ratios']:12.3f}"
        )
    print("\nratio: median of all harness samples / median of all bare samples; round ratio: the median,")
    print("over rounds, of each back-to-back pair's ratio of medians (robust to drift between rounds).")
    for b, r in rows.items():
        within = abs(r["median_of_round_ratios"] - 1) <= 0.05
        print(f"{b}: harness {'within' if within else 'NOT within'} 5% of the bare loop (round ratio)")


if __name__ == "__main__":
    main()
