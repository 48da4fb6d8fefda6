"""How much does phasesweep's harness add to a decode step? A benchmark, not a test.

For each backend, on the same tiny decode model (exported once per format), time in one
process a bare hand-written loop and phasesweep's harness, interleaved in alternating
blocks (which one goes first alternates too) so drift and noise hit both alike:

  backend       bare loop (the reference)                      harness
  eager         the graph module called directly, inside one   tasks/runtimes/<backend>.py:
                torch.inference_mode, on pre-built tensors     load(spec, meta, feeds),
  compile       the same torch.compile'd module called         bind(feeds) -> zero-arg call,
                directly, the same way                         timed by tasks.measure.bench.measure
  onnxruntime   InferenceSession.run_with_iobinding            with the session's sync and
  executorch    Method.execute                                 timer (eager, compile: inside
                                                               its timed_region, as bench_job)

Eager and compile time the very module object the harness's session holds (compile: the
graph compiled once, in load()), so only the calling and timing around it differ.

Each harness block is one measure() with BenchOptions that make it time exactly --calls
calls (min_iters = max_iters = calls, min_seconds 0, one warm-up call, target_ci so large
it never stops early); its first call and warm-up call are untimed. measure() freezes and
disables the garbage collector around its timed loop, so each bare block does the same
(gc.freeze + gc.disable, restored after): no collection lands in either side's samples.

Printed per backend: the median of every bare and every harness sample, their ratio
(harness / bare), the median over rounds of each back-to-back pair's ratio of medians (the
figure the 2% goal is judged on: robust to drift between rounds), its interquartile range
over rounds, and in how many rounds the harness was the slower.

    python scripts/bench_overhead.py                     # all four backends
    python scripts/bench_overhead.py --backend compile --rounds 30 --calls 300
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks.jobs import export_job  # noqa: E402
from tasks.measure.bench import measure  # noqa: E402
from tasks.runtimes import runtime_module  # noqa: E402
from tasks.specs import BenchOptions, BenchSpec, ExportSpec, ModelSpec, PhaseSpec  # noqa: E402
from tasks.worker.entries import load_export  # noqa: E402

BACKENDS = ("eager", "compile", "onnxruntime", "executorch")
FORMATS = {"eager": "none", "compile": "none", "onnxruntime": "onnx", "executorch": "executorch"}
GOAL = 0.02  # the harness within 2% of the bare loop (median of per-round ratios)


def tiny_model(name: str) -> ModelSpec:
    cfg = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    return ModelSpec(name=name, family=cfg["family"], size="tiny", arch=cfg["sizes"]["tiny"])


# The bare loops are written out on purpose: they are the reference the harness is compared
# with, so they share nothing with it and carry no abstraction of their own. Each disables
# the garbage collector around its block, as measure() does around its timed loop.
def bare_torch(module, feeds: dict[str, np.ndarray]):
    """eager and compile: `module` (the session's graph module, compiled or not) called
    directly on tensors built once, inside one inference_mode for the whole block. The
    tensors are made in inference mode, as the session's are: torch.compile guards on it."""
    import torch

    with torch.inference_mode():
        inputs = [torch.from_numpy(np.ascontiguousarray(a)).clone() for a in feeds.values()]

    def block(n: int) -> list[int]:
        samples = []
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            with torch.inference_mode():
                for _ in range(n):
                    t0 = time.perf_counter_ns()
                    module(*inputs)
                    samples.append(time.perf_counter_ns() - t0)
        finally:
            if enabled:
                gc.enable()
            gc.unfreeze()
        return samples

    return block


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
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            for _ in range(n):
                t0 = time.perf_counter_ns()
                sess.run_with_iobinding(binding)
                samples.append(time.perf_counter_ns() - t0)
        finally:
            if enabled:
                gc.enable()
            gc.unfreeze()
        return samples

    return block


def bare_executorch(path: Path, feeds: dict[str, np.ndarray], threads: int):
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    from tasks.runtimes.executorch import threadpool

    threadpool(portable_lib, "_unsafe_reset_threadpool")(threads)  # the guarded private setter
    method = Runtime.get().load_program(path).load_method("forward")
    inputs = [torch.from_numpy(np.ascontiguousarray(a)) for a in feeds.values()]

    def block(n: int) -> list[int]:
        samples = []
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            for _ in range(n):
                t0 = time.perf_counter_ns()
                method.execute(inputs)
                samples.append(time.perf_counter_ns() - t0)
        finally:
            if enabled:
                gc.enable()
            gc.unfreeze()
        return samples

    return block


def harness(session, feeds: dict[str, np.ndarray]):
    """The session's bound call timed by measure(), exactly n timed calls per block."""
    call = session.bind(feeds)
    region = getattr(session, "timed_region", nullcontext)  # torch: inference mode; compile: a recompile raises

    def block(n: int) -> list[int]:
        opts = BenchOptions(
            warmup_iters=1, warmup_max_seconds=0.0, min_iters=n, max_iters=n, min_seconds=0.0, target_ci=1e9
        )
        with region():
            m = measure(call, opts, session.sync, session.timer())
        assert len(m.samples_ns) == n, (len(m.samples_ns), n)
        return m.samples_ns

    return block


def _graphs_compiled() -> int:
    from tasks.runtimes.compile import dynamo_counters

    counters = dynamo_counters()  # guarded: None where an upgrade moved them
    if counters is None:
        raise SystemExit("scripts/bench_overhead.py: this torch has no dynamo counters to check recompiles with")
    return int(counters["stats"]["unique_graphs"])


def compare(backend: str, args, work: Path) -> dict[str, float]:
    model = tiny_model(args.model)
    phase = PhaseSpec("decode", batch=1, context_len=args.context_len, parity_steps=8)
    export = export_job(ExportSpec(f"overhead-{backend}", model, phase, FORMATS[backend], str(work / backend)))
    if not export.ok:
        raise SystemExit(f"export failed: {export.failure.error}\n{export.failure.traceback}")
    out = Path(export.out_dir)
    meta, feeds, _ = load_export(out)
    spec = BenchSpec(
        variant=f"overhead_{backend}",
        runtime=backend,
        device="cpu",
        model=model,
        phase=phase,
        export_dir=str(out),
        bench=BenchOptions(threads=args.threads),
    )
    t0 = time.perf_counter()
    session = runtime_module(backend).load(spec, meta, feeds)  # compile: compiles here, once
    load_s = time.perf_counter() - t0
    if backend in ("eager", "compile"):
        bare = bare_torch(session.module, feeds)
    elif backend == "onnxruntime":
        bare = bare_onnxruntime(out / meta["artifact"], feeds, args.threads)
    else:
        bare = bare_executorch(out / meta["artifact"], feeds, args.threads)
    ours = harness(session, feeds)
    graphs = _graphs_compiled() if backend == "compile" else 0
    bare(args.calls), ours(args.calls)  # warm both
    b_all, h_all, ratios = [], [], []
    for r in range(args.rounds):  # alternate which goes first
        first, second = (bare, ours) if r % 2 == 0 else (ours, bare)
        s1, s2 = first(args.calls), second(args.calls)
        b, h = (s1, s2) if r % 2 == 0 else (s2, s1)
        b_all += b
        h_all += h
        ratios.append(np.median(h) / np.median(b))
    if backend == "compile" and _graphs_compiled() != graphs:
        raise SystemExit("compile: the bare loop recompiled the module; its timings are not of the same graph")
    bare_med, ours_med = float(np.median(b_all)) / 1e3, float(np.median(h_all)) / 1e3
    q1, q3 = np.percentile(ratios, [25, 75])
    return {
        "bare_median_us": bare_med,
        "harness_median_us": ours_med,
        "ratio_of_medians": ours_med / bare_med,
        "median_of_round_ratios": float(np.median(ratios)),
        "round_ratio_q1": float(q1),
        "round_ratio_q3": float(q3),
        "harness_slower_rounds": int(sum(x > 1 for x in ratios)),
        "samples_each": len(b_all),
        "load_seconds": load_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    p.add_argument("--model", default="llama")
    p.add_argument("--context-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for b in backends:
            rows[b] = compare(b, args, Path(tmp))
            gc.collect()  # the session and its module go before the next backend loads
    print(
        f"\n{args.model} decode, context {args.context_len}, {args.threads} thread(s), "
        f"{args.rounds} interleaved rounds x {args.calls} calls"
    )
    print(
        f"{'backend':<12} {'bare us':>9} {'harness us':>11} {'ratio':>7} {'round ratio':>12} {'IQR':>13} {'slower':>7}"
    )
    for b, r in rows.items():
        iqr = f"{r['round_ratio_q1']:.3f}-{r['round_ratio_q3']:.3f}"
        print(
            f"{b:<12} {r['bare_median_us']:9.1f} {r['harness_median_us']:11.1f} "
            f"{r['ratio_of_medians']:7.3f} {r['median_of_round_ratios']:12.3f} {iqr:>13} "
            f"{r['harness_slower_rounds']:>3}/{args.rounds:<3}"
        )
    print("\nratio: median of all harness samples / median of all bare samples; round ratio: the median,")
    print("over rounds, of each back-to-back pair's ratio of medians (robust to drift between rounds);")
    print("IQR: its interquartile range over rounds; slower: rounds in which the harness's median was higher.")
    for b, r in rows.items():
        within = abs(r["median_of_round_ratios"] - 1) <= GOAL
        print(f"{b}: harness {'within' if within else 'NOT within'} {GOAL:.0%} of the bare loop (round ratio)")


if __name__ == "__main__":
    main()
