"""The one door: export_job(spec) and bench_job(spec), called by Ray workers, tests or notebooks.

Pure functions of plain specs. They never raise for a variant's own failure: they return
a result whose `failure` names the stage and carries the traceback.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from tasks.specs import BenchResult, BenchSpec, ExportResult, ExportSpec, Failure

META = "meta.json"
INPUTS = "inputs.npz"  # the timed call's feeds, by graph input name
PARITY = "parity.npz"  # step tokens and reference logits


def _failure(stage: str, exc: BaseException) -> Failure:
    return Failure(stage, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _result_from_meta(spec: ExportSpec, out: Path, cache_hit: bool) -> ExportResult:
    meta = json.loads((out / META).read_text())
    return ExportResult(
        key=spec.key,
        out_dir=str(out),
        ok=True,
        cache_hit=cache_hit,
        artifact=str(out / meta["artifact"]) if meta["artifact"] else None,
        export_seconds=meta["export_seconds"],
        artifact_mb=meta["artifact_mb"],
        input_shapes=meta["input_shapes"],
        details=meta["details"],
    )


def export_job(spec: ExportSpec) -> ExportResult:
    """Build the model, generate the phase's inputs and reference, export the graph.

    The cache entry is written in a temporary folder and renamed into place complete, so
    an entry with meta.json is always whole and a rerun with the same key reuses it.
    """
    _RAN.append("export")
    out = Path(spec.out_dir)
    if (out / META).is_file():
        return _result_from_meta(spec, out, cache_hit=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        import torch

        from tasks.export import format_module
        from tasks.models import build_model, count_parameters, embedding_facts, model_dims
        from tasks.phases import phase_module

        fmt = format_module(spec.export_format)
        phase = phase_module(spec.phase.name)
        m = spec.model
        model = build_model(m)
        dims = model_dims(model)
        phase.check(spec.phase, dims)
        data = phase.make_data(model, spec.phase, m.kv_cache, dims)
        graph = phase.build_graph(model, m.family, m.kv_cache, m.attention)
        input_names, output_names = phase.io_names(dims["layers"])
        t0 = time.perf_counter()
        artifact, details = fmt.export(graph, data.example_args(), input_names, output_names, tmp, spec.options)
        export_seconds = time.perf_counter() - t0
        np.savez(tmp / INPUTS, **data.feeds)
        np.savez(tmp / PARITY, **data.parity)
        artifact_bytes = sum(p.stat().st_size for p in tmp.glob(f"{artifact}*")) if artifact else 0
        meta = {
            "key": spec.key,
            "export_format": spec.export_format,
            "artifact": artifact,
            "export_seconds": export_seconds,
            "artifact_mb": artifact_bytes / 2**20,
            "input_names": input_names,
            "output_names": output_names,
            "input_shapes": data.shapes(),
            "input_dtypes": data.dtypes,
            "details": {
                **details,
                **data.dims,
                **embedding_facts(model),
                "parameters": count_parameters(model),
                "torch": torch.__version__,
            },
        }
        (tmp / META).write_text(json.dumps(meta, indent=1))
        del model, graph, data
        _release_memory()  # the worker lives on: give a large model's memory back to the OS
        try:
            tmp.rename(out)
        except OSError:  # another worker filled the same entry first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return _result_from_meta(spec, out, cache_hit=False)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return ExportResult(key=spec.key, out_dir=str(out), ok=False, failure=_failure("export", exc))


def load_export(export_dir: str | Path) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An export cache entry: (meta, the timed call's feeds in input order, parity data)."""
    export_dir = Path(export_dir)
    meta = json.loads((export_dir / META).read_text())
    with np.load(export_dir / INPUTS) as z:
        feeds = {name: z[name] for name in meta["input_names"]}
    with np.load(export_dir / PARITY) as z:
        parity = {name: z[name] for name in z.files}
    return meta, feeds, parity


def _release_memory() -> None:
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


# What this process has run so far: a benchmark reports it, so a test can prove that no
# benchmark shares a process with an export or another benchmark.
_RAN: list[str] = []


def _vm_hwm_mb() -> float:
    """Peak resident memory of this process since start or the last reset_peak_rss()."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM, so the next peak is the timing's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the benchmark's own process: end when the worker that started it ends."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def bench_in_fresh_process(spec: BenchSpec) -> BenchResult:
    """bench_job in a new process (spawned: nothing inherited) that runs nothing else.

    A Ray worker that ran an export may be handed a benchmark next; running the benchmark in
    a child of its own keeps its memory, threads and caches its own."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_die_with_parent) as pool:
        try:
            return pool.submit(bench_job, spec).result()
        except BrokenProcessPool as e:  # the child died: a segfault, os._exit, the OOM killer
            return BenchResult(spec.variant, ok=False, failure=Failure("benchmark", f"benchmark process died: {e}"))


def bench_job(spec: BenchSpec) -> BenchResult:
    """Load the backend, time its first call, check parity against the reference, then
    time the phase's call."""
    from tasks.bench import bench_metrics, measure, wall_clock
    from tasks.environment import fingerprint, peak_bandwidth_gbs
    from tasks.export import format_module
    from tasks.machine import benchmark_cores, core_list, watch
    from tasks.parity import tolerance
    from tasks.phases import phase_module
    from tasks.runtimes import runtime_module

    ran_before = ",".join(_RAN)
    _RAN.append("bench")
    result = BenchResult(variant=spec.variant, ok=False)
    cores = benchmark_cores(spec.device, spec.bench.threads)  # pinned before loading: thread pools inherit it
    result.params["bench_cores"] = core_list(cores)
    stage = "load"
    try:
        phase = phase_module(spec.phase.name)
        runtime = runtime_module(spec.runtime)
        meta, feeds, parity_data = load_export(spec.export_dir)
        libraries = (*format_module(meta["export_format"]).LIBRARIES, *runtime.LIBRARIES)
        result.env = fingerprint(spec.device, libraries)
        result.params.update(pid=os.getpid(), process_ran_before=ran_before or "nothing")
        t0 = time.perf_counter()
        session = runtime.load(spec, meta, feeds)
        result.metrics["load_seconds"] = time.perf_counter() - t0
        result.metrics.update(session.metrics)
        result.params.update(session.info)
        call = session.bind(feeds)
        timer = session.timer() or wall_clock(session.sync)
        result.metrics["first_call_ms"] = timer(call) / 1e6  # the fresh session's first call, before parity

        stage = "parity"
        atol = tolerance(spec.model.dtype, spec.bench.parity_atol)
        par = phase.check_parity(session, feeds, parity_data, atol)
        result.parity = par
        result.metrics.update(
            parity_max_abs_diff=par["max_abs_diff"],
            parity_top1_agreement=par["top1_agreement"],
            parity_steps=par["steps"],
        )
        if "cache_max_abs_diff" in par:
            result.metrics["parity_cache_max_abs_diff"] = par["cache_max_abs_diff"]
        if hasattr(session, "recompiles"):  # torch.compile: graphs compiled again by parity's calls
            result.metrics["compile_recompiles"] = float(session.recompiles())
        if not par["passed"]:
            worst = int(np.argmax(par["per_step_max_abs_diff"]))
            result.failure = Failure(
                "parity",
                f"logits differ from eager by {par['max_abs_diff']:.3g} (atol {par['atol']:g}), top-1 agreement "
                f"{par['top1_agreement']:.0%} (worst at step {worst + 1} of {par['steps']})",
            )
            return result

        stage = "benchmark"
        result.metrics["peak_rss_load_mb"] = _vm_hwm_mb()  # loading, first call and parity
        reset = _reset_peak_rss()
        with getattr(session, "timed_region", nullcontext)(), watch(cores) as machine:
            m = measure(call, spec.bench, session.sync, session.timer())
        result.metrics.update(machine.metrics)  # load, other processes' share of the bench cores
        result.params.update(machine.params)
        stats = bench_metrics(m, spec.bench)
        tokens = spec.phase.batch * phase.tokens_per_call(spec.phase)
        result.metrics.update(stats)
        result.metrics.update(
            tokens_per_s=tokens / (stats["latency_ms_median"] / 1e3),
            warmup_iters=m.warmup_iters,
            warmup_seconds=m.warmup_seconds,
            peak_rss_mb=_vm_hwm_mb() if reset else result.metrics["peak_rss_load_mb"],  # while timing
            **session.device_metrics(),
        )
        peak = spec.peak_bandwidth_gbs or peak_bandwidth_gbs(result.env.get("gpu_name", ""))
        result.metrics.update(
            phase.extra_metrics(
                model_dtype=spec.model.dtype,
                details=meta["details"],
                feeds=feeds,
                median_ms=stats["latency_ms_median"],
                peak_gbs=peak if spec.device == "cuda" else None,
            )
        )
        result.samples_ns = m.samples_ns  # to the driver, inline
        result.first_call_ns = int(result.metrics["first_call_ms"] * 1e6)
        result.ok = True
    except Exception as exc:
        result.failure = _failure(stage, exc)
    return result
