"""The one door: export_job(spec) and bench_job(spec), called by Ray workers, tests or notebooks.

Pure functions of plain specs. They never raise for a variant's own failure: they return
a result whose `failure` names the stage and carries the traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from tasks.measure.machine import alive, die_with_parent
from tasks.specs import BenchResult, BenchSpec, CaptureResult, CaptureSpec, ExportResult, ExportSpec, Failure

META = "meta.json"
MANIFEST = "manifest.json"  # written last: sizes and checksums of every file of the entry
CHECKSUM_BYTES = 1 << 30  # larger files are verified by size only (hashing GBs at every hit costs seconds)
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
        anatomy=meta.get("anatomy"),
    )


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(entry: Path) -> None:
    """Every file's size and checksum, written last: an entry without it is incomplete."""
    files = sorted(p for p in entry.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {p.name: {"bytes": p.stat().st_size, "sha256": _digest(p)} for p in files}
    (entry / MANIFEST).write_text(json.dumps(manifest, indent=1))


def verify_entry(entry: Path) -> str | None:
    """Why a cache entry cannot be trusted (missing, partial, corrupt), or None. Files up to
    CHECKSUM_BYTES are checksummed, larger ones (external weights of big models) sized."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable manifest.json (an export that did not finish)"
    for name, want in manifest.items():
        path = entry / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, the manifest says {want['bytes']}"
        if size <= CHECKSUM_BYTES and _digest(path) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def _clean_dead_temporaries(parent: Path, name: str) -> None:
    """Temporary folders of exports whose process is gone (killed, timed out) on this host."""
    host = socket.gethostname()
    for tmp in parent.glob(f".{name}.*"):
        parts = tmp.name.split(".")  # "", name, host, pid, random
        if len(parts) >= 5 and parts[-3] == host and parts[-2].isdigit() and not alive(int(parts[-2])):
            shutil.rmtree(tmp, ignore_errors=True)


def cached_export(spec: ExportSpec, entry: str | Path) -> ExportResult | None:
    """The export's result read from its cache entry at `entry`, when the entry is there,
    complete and verified (a cache hit); None when it is to be made (export_job rebuilds an
    untrusted one). Torch-free: the driver of a local Ray reads its cache hits itself."""
    out = Path(entry)
    if out.exists() and verify_entry(out) is None:
        return _result_from_meta(spec, out, cache_hit=True)
    return None


def export_job(spec: ExportSpec) -> ExportResult:
    """Build the model, generate the phase's inputs and reference, export the graph.

    The cache entry is written in a temporary folder, sealed with a manifest of sizes and
    checksums, and renamed into place complete. A rerun with the same key verifies the
    entry and reuses it; a partial or corrupt entry is reported and rebuilt.
    """
    _RAN.append("export")
    out = Path(spec.out_dir)
    rebuilt = None
    if out.exists():
        rebuilt = verify_entry(out)
        if rebuilt is None:
            return _result_from_meta(spec, out, cache_hit=True)
        shutil.rmtree(out, ignore_errors=True)  # untrusted: rebuild it
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_dead_temporaries(out.parent, out.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{socket.gethostname()}.{os.getpid()}.", dir=out.parent))
    try:
        import torch

        from tasks.export import format_module
        from tasks.export._description import describe
        from tasks.model.models import build_model, count_parameters, embedding_facts, model_dims
        from tasks.phases import phase_module

        fmt = format_module(spec.export_format)
        phase = phase_module(spec.phase.name)
        m = spec.model
        model = build_model(m)
        dims = model_dims(model)
        phase.check(spec.phase, dims)
        data = phase.make_data(model, spec.phase, m.kv_cache, dims)
        graph = phase.build_graph(model, spec.phase, m.family, m.kv_cache, m.attention)
        input_names, output_names = phase.io_names(spec.phase, dims["layers"])
        description = describe(spec, dims, _signature(input_names, data.example_args()), _outputs(graph, data, output_names))
        t0 = time.perf_counter()
        artifact, details, anatomy = fmt.export(
            graph, data.example_args(), input_names, output_names, tmp, spec.options, description
        )
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
            "anatomy": anatomy,  # tasks.export._anatomy: what is inside the artifact (None without one)
            "details": {
                **details,
                **data.dims,
                **embedding_facts(model),
                "parameters": count_parameters(model),
                "torch": torch.__version__,
            },
        }
        (tmp / META).write_text(json.dumps(meta, indent=1))
        write_manifest(tmp)
        del model, graph, data
        _release_memory()  # the worker lives on: give a large model's memory back to the OS
        try:
            tmp.rename(out)
        except OSError:  # another worker filled the same entry first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        result = _result_from_meta(spec, out, cache_hit=False)
        if rebuilt:
            result.details["cache_rebuilt"] = rebuilt
        return result
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return ExportResult(key=spec.key, out_dir=str(out), ok=False, failure=_failure("export", exc))


def _signature(names: list[str], tensors: Any) -> dict[str, tuple[list[int], str]]:
    """{name: (shape, dtype)} of the graph's inputs or outputs, in order."""
    return {n: (list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, tensors, strict=True)}


def _outputs(graph: Any, data: Any, output_names: list[str]) -> dict[str, tuple[list[int], str]]:
    """The graph's outputs, from one eager call on copies of the inputs (a cache update may
    write into its inputs in place: the saved feeds stay as generated)."""
    import torch

    with torch.no_grad():
        outs = graph(*(a.clone() for a in data.example_args()))
    return _signature(output_names, outs if isinstance(outs, (tuple, list)) else (outs,))


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


def _child_main(conn: Any, fn: Callable[[Any], Any], spec: Any) -> None:
    die_with_parent()  # the worker that started it ends: so does it
    conn.send(fn(spec))  # the jobs return failures as results; they do not raise
    conn.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode} before returning a result"


EXPORT_SERVER = "export"  # the role of the fork server exports are forked from; benchmarks': "bench-<runtime>"


def fork_servers(formats: Iterable[str], runtimes: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The fork servers (tasks/worker/forks.py) a plan needs on each node, by role, each with what it
    imports once: one for exports (torch, transformers' modelling module of every family, each
    format's PRELOAD) and one per runtime for benchmarks (numpy and the runtime's PRELOAD
    only: a benchmark's process holds the libraries a spawned one of that runtime would load,
    so memory figures compare across runtimes). No formats: no export server."""
    from tasks.export import format_module
    from tasks.model.families import FAMILIES
    from tasks.runtimes import runtime_module

    servers = {}
    if formats := sorted(set(formats)):  # none to make (all in the cache): no export server
        export = ["torch", "transformers", *(f.rotary_module for f in FAMILIES.values())]
        for name in formats:
            export += getattr(format_module(name), "PRELOAD", ())
        servers[EXPORT_SERVER] = tuple(dict.fromkeys(export))
    for name in sorted(set(runtimes)):
        preload = ["numpy", "numpy.random", *getattr(runtime_module(name), "PRELOAD", ())]  # a child seeds numpy.random
        servers[bench_server(name)] = tuple(dict.fromkeys(preload))
    return servers


def bench_server(runtime: str) -> str:
    return f"bench-{runtime}"


def in_fresh_process(
    fn: Callable[[Any], Any], spec: Any, timeout_s: float | None, stage: str, forks: str | None = None
) -> Any:
    """fn(spec) in a process of its own, in which nothing ran before it.

    - a process of its own: a Ray worker that ran an export may be handed a benchmark next;
      in a child of its own the benchmark's memory, threads and caches are its own;
    - `forks` (a folder): forked by the fork server listening there (tasks/worker/forks.py), which
      has imported the heavy modules once, so the child starts in milliseconds; None, or
      no server there: spawned;
    - its own clock: `timeout_s` counts from the child's start, not the worker's start-up;
    - a crash is data: a segfault, os._exit or the OOM killer becomes a failed result that
      says how the process ended."""
    if forks is not None:
        from tasks.worker import forks as fork_server

        try:
            conn = fork_server.connect(forks)
        except (fork_server.ForkServerError, OSError) as e:
            import logging

            logging.getLogger(__name__).warning("%s; spawning the %s process instead", e, stage)
        else:
            kind, value = fork_server.run(conn, fn, spec, timeout_s)
            return _ended(spec, stage, timeout_s, kind, value)
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(send, fn, spec), name=f"phasesweep-{stage}")
    child.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            child.kill()
            return _ended(spec, stage, timeout_s, "timeout", None)
        try:
            return receive.recv()
        except EOFError:
            child.join(5)
            return _ended(spec, stage, timeout_s, "died", child.exitcode)
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receive.close()


def _ended(spec: Any, stage: str, timeout_s: float | None, kind: str, value: Any) -> Any:
    """A fresh process's result, or the failure that says how it ended without one."""
    if kind == "result":
        return value
    if kind == "timeout":
        return _failed(spec, Failure(stage, f"timed out after {timeout_s:g}s of its own run (cluster.task_timeout_s)"))
    if kind == "lost":
        return _failed(spec, Failure(stage, f"the fork server of the {stage} process ended before its result came"))
    return _failed(spec, Failure(stage, f"the {stage} process died: {_death(value)}"))


def _failed(spec: Any, failure: Failure) -> ExportResult | BenchResult | CaptureResult:
    if isinstance(spec, ExportSpec):
        return ExportResult(key=spec.key, out_dir=spec.out_dir, ok=False, failure=failure)
    if isinstance(spec, CaptureSpec):
        return CaptureResult(key=spec.key, ok=False, failure=failure)
    return BenchResult(spec.variant, ok=False, failure=failure)


def bench_in_fresh_process(
    spec: BenchSpec, timeout_s: float | None = None, forks: str | None = None
) -> BenchResult:
    """bench_job in a process of its own (see in_fresh_process)."""
    return in_fresh_process(bench_job, spec, timeout_s, "benchmark", forks)


def export_in_fresh_process(
    spec: ExportSpec, timeout_s: float | None = None, forks: str | None = None
) -> ExportResult:
    """export_job in a process of its own: a crashing exporter fails its entry, not the worker."""
    return in_fresh_process(export_job, spec, timeout_s, "export", forks)


def bench_job(spec: BenchSpec) -> BenchResult:
    """Load the backend, time its first call, check parity against the reference, then
    time the phase's call."""
    from tasks.export import format_module
    from tasks.measure.bench import bench_metrics, measure, wall_clock
    from tasks.measure.environment import fingerprint, peak_bandwidth_gbs
    from tasks.measure.machine import benchmark_cores, core_list, watch
    from tasks.measure.parity import tolerance
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
        from tasks.worker.forks import FORKED, imported_since_fork

        result.params.update(
            pid=os.getpid(), process_ran_before=ran_before or "nothing", process_start="forked" if FORKED else "spawned"
        )
        t0 = time.perf_counter()
        session = runtime.load(spec, meta, feeds)
        result.metrics["load_seconds"] = time.perf_counter() - t0
        result.metrics.update(session.metrics)
        result.params.update(session.info)
        call = session.bind(feeds)
        timer = session.timer() or wall_clock(session.sync)
        # the context every timed call runs in (torch: inference mode, entered once; compile:
        # a recompile inside it fails the variant), around the first call and the timed loop
        timed_region = getattr(session, "timed_region", nullcontext)
        with timed_region():
            result.metrics["first_call_ms"] = timer(call) / 1e6  # the fresh session's first call, before parity

        stage = "parity"
        atol = tolerance(spec.model.dtype, spec.bench.parity_atol)
        par = phase.check_parity(session, spec.phase, feeds, parity_data, atol)
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
                f"logits differ from eager by {par['max_abs_diff']:.3g} (atol {par['atol']:g}), top-1 within "
                f"tolerance {par['top1_within_tolerance']:.0%} (worst at step {worst + 1} of {par['steps']})",
            )
            return result

        stage = "benchmark"
        result.metrics["peak_rss_load_mb"] = _vm_hwm_mb()  # loading, first call and parity
        reset = _reset_peak_rss()
        with timed_region(), watch(cores) as machine:
            m = measure(call, spec.bench, session.sync, session.timer())
        result.metrics.update(machine.metrics)  # load, other processes' share of the bench cores
        result.params.update(machine.params)
        stats = bench_metrics(m, spec.bench)
        if (late := imported_since_fork()) is not None:  # loading, parity and timing, all done
            result.params["imports_after_fork"] = ",".join(late) or "none"
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
                phase=spec.phase,
                model_dtype=spec.model.dtype,
                details=meta["details"],
                feeds=feeds,
                median_ms=stats["latency_ms_median"],
                peak_gbs=peak if spec.device == "cuda" else None,
            )
        )
        result.samples_ns = m.samples_ns  # to the driver, inline
        result.first_call_ns = int(result.metrics["first_call_ms"] * 1e6)
        if spec.bench.profile:  # after every timed call: the profiler never touches the numbers above
            stage = "profile"
            from tasks.measure.profiles import CALLS

            with tempfile.TemporaryDirectory(prefix="phasesweep-profile-") as folder, timed_region():
                result.profile = session.profile(feeds, CALLS, Path(folder))
        result.ok = True
    except Exception as exc:
        result.failure = _failure(stage, exc)
    return result
