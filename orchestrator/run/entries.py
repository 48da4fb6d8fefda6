"""What a Ray task runs: each kind's work in a fresh child process of the worker's
(tasks/jobs.py), through this node's fork server when it has one."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.run.fork_hosts import fork_folder


def node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def export_entry(spec, timeout_s, forks, ship):
    """The export, into this node's own cache (tasks/worker/transfer.py); with `ship`, its entry
    packed as the task's second return, which Ray's object store takes to any node."""
    from tasks.jobs import export_in_fresh_process
    from tasks.worker.forks import EXPORT_SERVER
    from tasks.worker.transfer import node_entry, pack

    result = export_in_fresh_process(replace(spec, out_dir=node_entry(spec.out_dir)), timeout_s, fork_folder(forks, EXPORT_SERVER))
    if not result.ok:
        return result, None
    result.details["ray_node"] = node_id()
    return result, pack(result.out_dir) if ship else None


def bench_entry(spec, timeout_s, forks, packed=None):
    """The benchmark on this node's copy of its export, unpacked from what the export sent
    when this node's cache lacks it (no shared filesystem needed)."""
    from tasks.jobs import bench_in_fresh_process
    from tasks.specs import BenchResult, Failure
    from tasks.worker.forks import bench_server
    from tasks.worker.transfer import localise, node_entry

    spec = replace(spec, export_dir=node_entry(spec.export_dir))
    try:
        source = localise(spec.export_dir, packed)
    except (OSError, ValueError) as e:
        return BenchResult(spec.variant, ok=False, failure=Failure("load", f"the export is not on this node: {e}"))
    result = bench_in_fresh_process(spec, timeout_s, fork_folder(forks, bench_server(spec.runtime)))
    result.params.update(ray_node=node_id(), export_source=source)
    return result


def capture_entry(spec, timeout_s, _forks):
    """The application, spawned: its imports are its own."""
    from tasks.phases.captured import capture_in_fresh_process

    return capture_in_fresh_process(spec, timeout_s)
