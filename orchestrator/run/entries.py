"""What a Ray task runs: each kind's work in a fresh child process of the worker's
(tasks/jobs.py), through this node's fork server when it has one. A Hugging Face id is made
this node's snapshot folder of its commit first (tasks.model.hub.local_model): the work sees a
folder, and no node needs a shared one."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from orchestrator.run.fork_hosts import fork_folder
from tasks.model.hub import local_model
from tasks.specs import AppLoopResult, BenchResult, CaptureResult, ExportResult, Failure
from tasks.worker.forks import EXPORT_SERVER, bench_server


def node_id() -> str:
    import ray  # lazy: the driver imports this module before Ray starts

    return ray.get_runtime_context().get_node_id()


def on_this_node(spec):
    """`spec` with its model's Hugging Face id made this node's snapshot folder, or the Failure
    of fetching it (huggingface_hub's errors are OSErrors)."""
    try:
        return replace(spec, model=local_model(spec.model)), None
    except (OSError, ValueError) as e:
        return spec, Failure("load", f"model.checkpoint={spec.model.checkpoint!r} at commit {spec.model.revision}: {e}")


def export_entry(spec, timeout_s, forks, ship):
    """The export, into this node's own cache (tasks/worker/transfer.py); with `ship`, its entry
    packed as the task's second return, which Ray's object store takes to any node."""
    # lazy: numpy and this kind's modules; every Ray worker imports this module
    from tasks.jobs import export_in_fresh_process
    from tasks.worker.transfer import node_entry, pack

    spec, failure = on_this_node(spec)
    if failure:
        return ExportResult(spec.key, spec.out_dir, ok=False, failure=failure), None
    result = export_in_fresh_process(replace(spec, out_dir=node_entry(spec.out_dir)), timeout_s, fork_folder(forks, EXPORT_SERVER))
    if not result.ok:
        return result, None
    result.details["ray_node"] = node_id()
    return result, pack(result.out_dir) if ship else None


def bench_entry(spec, timeout_s, forks, packed=None):
    """The benchmark on this node's copy of its export, unpacked from what the export sent
    when this node's cache lacks it (no shared filesystem needed)."""
    # lazy: numpy and this kind's modules; every Ray worker imports this module
    from tasks.jobs import bench_in_fresh_process
    from tasks.worker.transfer import localise, node_entry

    spec, failure = on_this_node(replace(spec, export_dir=node_entry(spec.export_dir)))
    if failure:
        return BenchResult(spec.variant, ok=False, failure=failure)
    try:
        source = localise(spec.export_dir, packed)
    except (OSError, ValueError) as e:
        return BenchResult(spec.variant, ok=False, failure=Failure("load", f"the export is not on this node: {e}"))
    result = bench_in_fresh_process(spec, timeout_s, fork_folder(forks, bench_server(spec.runtime)))
    result.params.update(ray_node=node_id(), export_source=source)
    return result


def capture_entry(spec, timeout_s, _forks):
    """The application, spawned: its imports are its own."""
    # lazy: numpy and this kind's modules; every Ray worker imports this module
    from tasks.phases.captured import capture_in_fresh_process

    spec, failure = on_this_node(spec)
    if failure:
        return CaptureResult(spec.key, ok=False, failure=failure)
    return capture_in_fresh_process(spec, timeout_s)


def app_loop_entry(spec, timeout_s, _forks):
    """A captured application run again on a runtime (tasks/app_loop.py), spawned: the
    application's imports and both sessions are its own. It reads the exports where the sweep
    made them (a local Ray, or a cluster's shared cache folder)."""
    # lazy: numpy and this kind's modules; every Ray worker imports this module
    from tasks.app_loop import app_loop_in_fresh_process

    capture, failure = on_this_node(spec.capture)
    if failure:
        return AppLoopResult(spec.key, ok=False, failure=failure)
    return app_loop_in_fresh_process(replace(spec, capture=capture), timeout_s)


def pair_entry(spec, timeout_s, _forks, packed=(None, None)):
    """Baseline and candidate timed interleaved (tasks/paired.py) on this node's copies of
    their exports; each side in a fresh process of its own."""
    # lazy: numpy and this kind's modules; every Ray worker imports this module
    from tasks.paired import PairResult, paired_job
    from tasks.worker.transfer import localise, node_entry

    sides = []
    for bench, shipped in zip((spec.baseline, spec.candidate), packed, strict=True):
        bench, failure = on_this_node(replace(bench, export_dir=node_entry(bench.export_dir)))
        if failure:
            return PairResult(spec.name, failure=failure)
        try:
            localise(bench.export_dir, shipped)
        except (OSError, ValueError) as e:
            return PairResult(spec.name, failure=Failure("load", f"the export is not on this node: {e}"))
        sides.append(bench)
    spec = replace(spec, baseline=sides[0], candidate=sides[1])
    opts = spec.options
    if timeout_s is not None:  # the task's clock: both loads and the timed rounds
        spec = replace(spec, options=replace(opts, max_seconds=min(opts.max_seconds, max(1.0, timeout_s / 2)), load_timeout_s=timeout_s / 4))
    result = paired_job(spec)
    result.samples_ns = {}  # the blocks' medians tell the verdict; the sweep's runs hold every sample
    result.node = node_id()
    return result


def remeasure_entry(spec, timeout_s, _forks):
    """compare --remeasure on a cluster: the variant's pair rebuilt on this node from its runs
    in the tracking store (orchestrator/run/remeasure.py), timed interleaved here; a PairResult,
    or why it could not be rebuilt ("not re-measured: ...")."""
    from mlflow.tracking import MlflowClient  # lazy: a Ray worker loads mlflow only to re-measure

    # lazy: numpy and this kind's modules; every Ray worker imports this module
    from orchestrator.run.rebuild import Unavailable, pair_spec
    from tasks.paired import paired_job

    client = MlflowClient(tracking_uri=spec.uri)
    runs = {side: client.get_run(run_id) for side, run_id in spec.run_ids.items()}
    with tempfile.TemporaryDirectory(prefix="phasesweep-remeasure-") as tmp:
        try:
            pair = pair_spec(client, spec.name, runs, Path(tmp), spec.options, timeout_s)
        except Unavailable as e:
            return f"not re-measured: {e}"
        result = paired_job(pair)
    result.node = node_id()
    return result
