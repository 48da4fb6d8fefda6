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
from pathlib import Path

import numpy as np

from tasks.specs import DTYPE_BYTES, BenchResult, BenchSpec, ExportResult, ExportSpec, Failure

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
    out = Path(spec.out_dir)
    if (out / META).is_file():
        return _result_from_meta(spec, out, cache_hit=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        import torch

        from tasks.export import exporter
        from tasks.graphs import build_graph, io_names
        from tasks.models import build_model, count_parameters
        from tasks.phases import make_phase_data

        fmt = exporter(spec.export_format)
        model = build_model(spec.model)
        data = make_phase_data(model, spec.phase, spec.model.kv_cache)
        graph = build_graph(model, spec.phase.name, spec.model.kv_cache, spec.model.attention)
        input_names, output_names = io_names(spec.phase.name, data.dims["layers"])
        artifact, details = None, {}
        t0 = time.perf_counter()
        if fmt is not None:
            artifact, details = fmt.export(graph, data.example_args(), input_names, output_names, tmp, spec.options)
        export_seconds = time.perf_counter() - t0
        np.savez(tmp / INPUTS, **data.feeds)
        np.savez(tmp / PARITY, **data.parity)
        artifact_bytes = sum(p.stat().st_size for p in tmp.glob(f"{artifact}*")) if artifact else 0
        meta = {
            "key": spec.key,
            "artifact": artifact,
            "export_seconds": export_seconds,
            "artifact_mb": artifact_bytes / 2**20,
            "input_names": input_names,
            "output_names": output_names,
            "input_shapes": data.shapes(),
            "details": {**details, **data.dims, "parameters": count_parameters(model), "torch": torch.__version__},
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


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _decode_bandwidth(
    spec: BenchSpec, meta: dict, feeds: dict[str, np.ndarray], median_ms: float, env: dict[str, str]
) -> dict[str, float]:
    """Bytes a decode step must read (every weight once, the whole KV cache it attends
    over) per second of median latency, and on CUDA its fraction of the device's peak."""
    from tasks.environment import peak_bandwidth_gbs

    element = DTYPE_BYTES[spec.model.dtype]
    weights = meta["details"]["parameters"] * element
    cache = sum(a.nbytes for n, a in feeds.items() if n.startswith("past_key_values."))
    achieved = (weights + cache) / (median_ms / 1e3) / 1e9
    out = {"decode_bytes_per_step": float(weights + cache), "achieved_bandwidth_gbs": achieved}
    if spec.device == "cuda":
        peak = spec.peak_bandwidth_gbs or peak_bandwidth_gbs(env.get("gpu_name", ""))
        if peak:
            out.update(peak_bandwidth_gbs=peak, bandwidth_fraction_of_peak=achieved / peak)
    return out


def bench_job(spec: BenchSpec) -> BenchResult:
    """Load the backend, check parity against the reference, then time the phase's call."""
    from tasks.bench import measure, summarize
    from tasks.environment import fingerprint
    from tasks.parity import check
    from tasks.runtimes import runtime_module

    result = BenchResult(variant=spec.variant, ok=False)
    stage = "load"
    try:
        result.env = fingerprint(spec.device)
        result.params["pid"] = os.getpid()  # one fresh worker process per benchmark
        meta, feeds, parity_data = load_export(spec.export_dir)
        t0 = time.perf_counter()
        session = runtime_module(spec.backend).load(spec, meta, feeds)
        result.metrics["load_seconds"] = time.perf_counter() - t0
        result.metrics.update(session.metrics)
        result.params.update(session.info)

        stage = "parity"
        par = check(session, feeds, parity_data, spec.bench.parity_atol)
        result.parity = par
        result.metrics.update(
            parity_max_abs_diff=par["max_abs_diff"],
            parity_top1_agreement=par["top1_agreement"],
            parity_steps=par["steps"],
        )
        if not par["passed"]:
            worst = int(np.argmax(par["per_step_max_abs_diff"]))
            result.failure = Failure(
                "parity",
                f"logits differ from eager by {par['max_abs_diff']:.3g} > atol {par['atol']:g} "
                f"(worst at step {worst + 1} of {par['steps']})",
            )
            return result

        stage = "benchmark"
        m = measure(session.bind(feeds), spec.bench, session.sync, session.timer())
        stats = summarize(m.samples_ns)
        tokens = spec.phase.batch * spec.phase.new_tokens
        result.metrics.update(stats)
        result.metrics.update(
            tokens_per_s=tokens / (stats["latency_ms_median"] / 1e3),
            first_call_ms=m.first_call_ns / 1e6,
            warmup_iters=m.warmup_iters,
            warmup_seconds=m.warmup_seconds,
            peak_rss_mb=_peak_rss_mb(),
            **session.device_metrics(),
        )
        if spec.phase.name == "decode":
            result.metrics.update(_decode_bandwidth(spec, meta, feeds, stats["latency_ms_median"], result.env))
        out = Path(spec.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        samples = out / "latency_samples.json"
        samples.write_text(
            json.dumps(
                {"variant": spec.variant, "unit": "ns", "first_call_ns": m.first_call_ns, "samples": m.samples_ns}
            )
        )
        result.files = {"latency_samples.json": str(samples)}
        result.ok = True
    except Exception as exc:
        result.failure = _failure(stage, exc)
    return result
