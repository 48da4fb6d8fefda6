"""The one door: export_job(spec) and bench_job(spec), called by Ray workers, tests or notebooks.

Pure functions of plain specs. They never raise for a variant's own failure: they return
a result whose `failure` names the stage and carries the traceback.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tasks.depth_series import measure_series
from tasks.export import describe, format_module
from tasks.measure.bandwidth import machine_bandwidth
from tasks.measure.bench import bench_metrics, gc_paused, measure, wall_clock
from tasks.measure.environment import fingerprint, peak_bandwidth_gbs
from tasks.measure.machine import benchmark_cores, core_list, peak_rss_mb, reset_peak_rss, watch
from tasks.measure.parity import failure_text, quantized, tolerance
from tasks.measure.profiles import CALLS
from tasks.measure.quality import QUALITY
from tasks.measure.rhythm import in_rhythm, shorter
from tasks.model.families import FAMILIES
from tasks.model.models import build_model, count_parameters, embedding_facts, model_dims
from tasks.phases import phase_module
from tasks.quality_windows import make_quality
from tasks.quality_windows import measure as measure_quality
from tasks.runtimes import runtime_module
from tasks.specs import IN_GRAPH_KV_CACHES, BenchResult, BenchSpec, ExportResult, ExportSpec, Failure
from tasks.worker import envs, forks
from tasks.worker.entries import (
    INPUTS,
    META,
    PARITY,
    clean_dead_temporaries,
    load_export,
    result_from_meta,
    save_series,
    share_files,
    verify_entry,
    write_manifest,
)
from tasks.worker.forks import EXPORT_BASE, EXPORT_SERVER, bench_server, imported_since_fork
from tasks.worker.fresh import failed, in_fresh_process

# What this process has run: a benchmark reports it, so a test can prove no benchmark
# shares a process with an export or another benchmark.
_RAN: list[str] = []


def _failure(stage: str, exc: BaseException) -> Failure:
    return Failure(stage, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def export_job(spec: ExportSpec) -> ExportResult:
    """Build the model, generate the phase's inputs and reference, export the graph. The entry
    is written in a temporary folder, sealed (tasks/worker/entries.py) and renamed into place;
    a rerun reuses a verified entry and rebuilds an untrusted one. The process lives on (a
    notebook, a script): the model's memory goes back to the OS."""
    result = _export_job(spec)
    _release_memory()
    return result


def _export_job(spec: ExportSpec) -> ExportResult:
    """export_job in a process that ends after it (export_in_fresh_process): nothing to give back."""
    _RAN.append("export")
    out = Path(spec.out_dir)
    rebuilt = None
    if out.exists():
        rebuilt = verify_entry(out)
        if rebuilt is None:
            return result_from_meta(spec, out, cache_hit=True)
        shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_dead_temporaries(out.parent, out.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{socket.gethostname()}.{os.getpid()}.", dir=out.parent))
    try:
        meta = _export_into(spec, tmp)
        (tmp / META).write_text(json.dumps(meta, indent=1))
        write_manifest(tmp)
        share_files(tmp)  # a model's weights once in the cache, however many of its graphs hold them
        try:
            tmp.rename(out)
        except OSError:  # another worker filled the same entry first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        result = result_from_meta(spec, out, cache_hit=False)
        if rebuilt:
            result.details["cache_rebuilt"] = rebuilt
        return result
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return ExportResult(key=spec.key, out_dir=str(out), ok=False, failure=_failure("export", exc))


def _export_into(spec: ExportSpec, tmp: Path) -> dict[str, Any]:
    """Build the model, make the phase's data, export the graph into `tmp` with the data beside
    it: the entry's meta. The model, graph and data are freed when it returns."""
    import torch  # lazy: torch, only in a job's process

    phase = phase_module(spec.phase.name)
    fmt = format_module(spec.export_format)
    m = spec.model
    model = build_model(m)
    dims = model_dims(model)
    phase.check(spec.phase, dims)
    kv_cache = IN_GRAPH_KV_CACHES[0] if fmt.OWN_CACHE else m.kv_cache  # its runtime fills its own cache
    data = phase.make_data(model, spec.phase, kv_cache, dims)
    quality, quality_note = make_quality(model, phase, spec, dims, kv_cache)  # before the swap: the eager model's own
    input_names, output_names = phase.io_names(spec.phase, dims["layers"], kv_cache)
    graph, outputs = _graph(fmt.OWN_CACHE, phase, model, spec, data, output_names)
    description = describe(spec, dims, _signature(input_names, data.example_args()), outputs)
    t0 = time.perf_counter()
    artifact, details, anatomy = fmt.export(graph, data.example_args(), input_names, output_names, tmp, spec.options, description)
    export_seconds = time.perf_counter() - t0
    np.savez(tmp / INPUTS, **data.feeds)
    np.savez(tmp / PARITY, **data.parity)
    save_series(tmp, data.series)
    if quality is not None:
        np.savez(tmp / QUALITY, **quality)
    artifact_bytes = sum(p.stat().st_size for p in tmp.glob(f"{artifact}*")) if artifact else 0
    return {
        "key": spec.key,
        "export_format": spec.export_format,
        "artifact": artifact,
        "export_seconds": export_seconds,
        "artifact_mb": artifact_bytes / 2**20,
        "input_names": input_names,
        "output_names": output_names,
        "input_shapes": data.shapes(),
        "input_dtypes": data.dtypes,
        "anatomy": anatomy,  # tasks/export/_anatomy.py; None without an artifact
        "details": {
            **details,
            **data.dims,
            **embedding_facts(model),
            "parameters": count_parameters(model),
            "quality_inputs": quality_note,
            "torch": torch.__version__,
        },
    }


def _graph(own_cache: bool, phase: Any, model: Any, spec: ExportSpec, data: Any, output_names: list[str]) -> tuple[Any, dict]:
    """What the format exports, and its outputs' signature: the phase's graph, or for a format
    whose runtime keeps its own cache (OWN_CACHE) the transformers model itself, which returns
    the logits the reference returned."""
    if own_cache:
        logits = data.parity["ref_logits"]  # [steps, B, 1, V]
        return model, {output_names[0]: (list(logits.shape[1:]), str(next(model.parameters()).dtype).removeprefix("torch."))}
    m = spec.model
    graph = phase.build_graph(model, spec.phase, m.family, m.kv_cache, m.attention)
    return graph, _outputs(graph, data, output_names)


def _signature(names: list[str], tensors: Any) -> dict[str, tuple[list[int], str]]:
    """{name: (shape, dtype)} of the graph's inputs or outputs, in order."""
    return {n: (list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, tensors, strict=True)}


def _outputs(graph: Any, data: Any, output_names: list[str]) -> dict[str, tuple[list[int], str]]:
    """The graph's outputs, from one eager call on copies of the inputs (a cache update may
    write into its inputs in place)."""
    import torch  # lazy: torch, only in a job's process

    with torch.no_grad():
        outs = graph(*(a.clone() for a in data.example_args()))
    return _signature(output_names, outs if isinstance(outs, (tuple, list)) else (outs,))


def _release_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def fork_servers(exports: Iterable[tuple[str, str]], benches: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """The fork servers a plan needs on each node, by role, with what each imports once, from
    the (format, family) of each export to make and the (runtime, family) of each benchmark:
    one for exports (EXPORT_BASE, the modelling modules of its families, each format's
    PRELOAD; none when every export is cached) and one per runtime (numpy and its PRELOAD only,
    so a benchmark's process holds what a spawned one would and memory figures compare across
    runtimes; its families' modelling modules too where it builds models, Runtime.MODELS).
    Each imports this module last: a child unpickles its job (bench_job, _export_job) from here."""
    servers, benches = {}, set(benches)
    if exports := sorted(set(exports)):
        export = [*EXPORT_BASE, *_modelling({family for _, family in exports})]
        for name in dict.fromkeys(fmt for fmt, _ in exports):
            export += format_module(name).PRELOAD
        servers[EXPORT_SERVER] = tuple(dict.fromkeys([*export, __name__]))
    for name in sorted({runtime for runtime, _ in benches}):
        runtime = runtime_module(name)
        models = _modelling({family for r, family in benches if r == name}) if runtime.MODELS else []
        preload = ["numpy", "numpy.random", *runtime.PRELOAD, *models, __name__]  # a child seeds numpy.random
        servers[bench_server(name)] = tuple(dict.fromkeys(preload))
    return servers


def _modelling(families: Iterable[str]) -> list[str]:
    """transformers' modelling modules of these families (tasks/model/families.py)."""
    return list(dict.fromkeys(FAMILIES[f].rotary_module for f in sorted(families)))


def bench_in_fresh_process(spec: BenchSpec, timeout_s: float | None = None, forks: str | None = None) -> BenchResult:
    result, facts = _in_env(bench_job, spec, timeout_s, "benchmark", forks, spec.export_dir)
    result.params.update(facts)
    return result


def export_in_fresh_process(spec: ExportSpec, timeout_s: float | None = None, forks: str | None = None) -> ExportResult:
    """A crashing exporter fails its entry, not the worker."""
    result, facts = _in_env(_export_job, spec, timeout_s, "export", forks, spec.out_dir)
    result.details.update(facts)
    return result


def _in_env(fn: Any, spec: Any, timeout_s: float | None, stage: str, forks: str | None, entry: str) -> tuple[Any, dict[str, Any]]:
    """fn(spec) in a fresh process, and what its environment cost. With env.pip, its libraries
    made (or found) on this node beside the export cache's `entry` and first on the child's
    import path; the child is spawned, since a fork server holds the driver's libraries."""
    if not spec.env.pip:
        return in_fresh_process(fn, spec, timeout_s, stage, forks), {}
    try:
        built = envs.ensure(spec.env, entry)
    except envs.EnvError as e:
        return failed(spec, Failure(stage, str(e))), {}
    return in_fresh_process(fn, spec, timeout_s, stage, None, (built.site,)), envs.facts(built)


def bench_job(spec: BenchSpec) -> BenchResult:
    """Load the backend, time its first call, check parity against the reference, then time
    the phase's call."""

    ran_before = ",".join(_RAN)
    _RAN.append("bench")
    result = BenchResult(variant=spec.variant, ok=False)
    cores = benchmark_cores(spec.device, spec.bench.threads)  # pinned before loading: thread pools inherit it
    result.params["bench_cores"] = core_list(cores)
    stage = "load"
    try:
        phase = phase_module(spec.phase.name)
        meta, feeds, parity_data = load_export(spec.export_dir)
        session, call = _load(spec, meta, feeds, result, ran_before)
        stage = "parity"
        if not _parity(spec, phase, session, feeds, parity_data, result):
            return result
        stage = "benchmark"
        _benchmark(spec, phase, session, call, cores, meta, feeds, result)
        if phase.series(spec.phase):  # after the headline call: each other step of its series (decode's depths)
            measure_series(spec, phase, session, result, phase_extras(spec, phase, meta, result, cores))
            if result.failure is not None:
                return result
        if spec.rhythm_gap_ms is not None:  # after the headline: the same call in its application's rhythm
            growing = shorter(feeds) if spec.model.kv_cache == "dynamic" else None
            calls = [call] if growing is None else [call, session.bind(growing)]
            with session.timed_region(), gc_paused():
                metrics, series = in_rhythm(calls, spec.rhythm_gap_ms, session.timer() or wall_clock(session.sync))
            result.metrics.update(metrics)
            result.series.update(series)
        if spec.bench.profile:  # after every timed call: the profiler never touches the numbers above
            stage = "profile"

            with tempfile.TemporaryDirectory(prefix="phasesweep-profile-") as folder, session.timed_region():
                result.profile = session.profile(feeds, CALLS, Path(folder))
        if spec.bench.quality:  # after every timed call, through the same session
            stage = "quality"

            result.metrics.update(measure_quality(session, phase, spec.phase, feeds, spec.export_dir))  # as parity: untimed
        result.ok = True
    except Exception as exc:
        result.failure = _failure(stage, exc)
    return result


def _load(spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray], result: BenchResult, ran_before: str):
    """The runtime's session and its bound call, with the load's time and the fresh session's
    first call (before parity) in `result`."""

    runtime = runtime_module(spec.runtime)
    result.env = fingerprint(spec.device, (*format_module(meta["export_format"]).LIBRARIES, *runtime.LIBRARIES))
    result.params.update(
        pid=os.getpid(), process_ran_before=ran_before or "nothing", process_start="forked" if forks.FORKED else "spawned"
    )
    t0 = time.perf_counter()
    session = runtime.load(spec, meta, feeds)
    result.metrics["load_seconds"] = time.perf_counter() - t0
    result.metrics.update(session.metrics)
    result.params.update(session.info)
    call = session.bind(feeds)
    timer = session.timer() or wall_clock(session.sync)
    with session.timed_region():
        result.metrics["first_call_ms"] = timer(call) / 1e6  # the fresh session's first call, before parity
    return session, call


def _parity(spec: BenchSpec, phase: Any, session: Any, feeds: dict, parity_data: dict, result: BenchResult) -> bool:
    """Check the outputs against the export's reference; False (and result.failure) if they differ."""

    atol = tolerance(spec.model.dtype, spec.bench.parity_atol)
    par = phase.check_parity(session, spec.phase, feeds, parity_data, atol)
    if spec.model.quant != "none":  # against the float reference: a bound on the relative error
        par = quantized(par, spec.model.quant)
    result.parity = par
    result.metrics.update(
        parity_max_abs_diff=par["max_abs_diff"],
        parity_top1_agreement=par["top1_agreement"],
        parity_max_rel_error=par["max_rel_error"],
        parity_steps=par["steps"],
    )
    if "rel_error_bound" in par:  # quantised: judged by its relative error (tasks.measure.parity.quantized)
        result.metrics["parity_rel_error_bound"] = par["rel_error_bound"]
    if "cache_max_abs_diff" in par:
        result.metrics["parity_cache_max_abs_diff"] = par["cache_max_abs_diff"]
    if (recompiles := session.recompiles()) is not None:  # torch.compile
        result.metrics["compile_recompiles"] = float(recompiles)
    if not par["passed"]:
        result.failure = Failure("parity", failure_text(par, spec.model.quant))
    return par["passed"]


def phase_extras(
    spec: BenchSpec, phase: Any, meta: dict, result: BenchResult, cores: list[int]
) -> Callable[[dict[str, np.ndarray], float], dict[str, float]]:
    """`extras(feeds, median_ms)`: the phase's own metrics of a call on `feeds` timed at that median.
    The device's peak bandwidth on a GPU; on a CPU the machine's own (tasks/measure/bandwidth.py),
    probed with the benchmark's threads the first time a phase asks for it on this machine."""
    peak = spec.peak_bandwidth_gbs or peak_bandwidth_gbs(result.env.get("gpu_name", ""))
    threads = spec.bench.threads or len(cores) or 1
    roofline = cache(lambda: machine_bandwidth(threads)) if spec.device == "cpu" else None

    def extras(feeds: dict[str, np.ndarray], median_ms: float) -> dict[str, float]:
        return phase.extra_metrics(
            phase=spec.phase,
            model_dtype=spec.model.dtype,
            details=meta["details"],
            anatomy=meta.get("anatomy"),
            feeds=feeds,
            median_ms=median_ms,
            peak_gbs=peak if spec.device == "cuda" else None,
            bandwidth=roofline,
        )

    return extras


def _benchmark(
    spec: BenchSpec, phase: Any, session: Any, call: Any, cores: Any, meta: dict, feeds: dict, result: BenchResult
) -> None:
    """Time the bound call (tasks/measure/bench.py) while watching the machine; its statistics,
    memory and the phase's own metrics into `result`."""

    result.metrics["peak_rss_load_mb"] = peak_rss_mb()  # loading, first call and parity
    reset = reset_peak_rss()
    with session.timed_region(), watch(cores) as machine:
        m = measure(call, spec.bench, session.sync, session.timer())
    result.metrics.update(machine.metrics)
    result.params.update(machine.params)
    stats = bench_metrics(m, spec.bench)
    if (late := imported_since_fork()) is not None:
        result.params["imports_after_fork"] = ",".join(late) or "none"
    tokens = spec.phase.batch * phase.tokens_per_call(spec.phase)
    result.metrics.update(stats)
    result.metrics.update(
        tokens_per_s=tokens / (stats["latency_ms_median"] / 1e3),
        warmup_iters=m.warmup_iters,
        warmup_seconds=m.warmup_seconds,
        peak_rss_mb=peak_rss_mb() if reset else result.metrics["peak_rss_load_mb"],  # while timing
        **session.device_metrics(),
    )
    result.metrics["tokens_per_s_per_sequence"] = result.metrics["tokens_per_s"] / spec.phase.batch
    result.metrics.update(phase_extras(spec, phase, meta, result, cores)(feeds, stats["latency_ms_median"]))
    result.samples_ns = m.samples_ns
    result.first_call_ns = int(result.metrics["first_call_ms"] * 1e6)
