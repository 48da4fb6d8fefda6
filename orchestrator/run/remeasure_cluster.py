"""`compare --remeasure --cluster ADDRESS`: each variant's re-measurement is a Ray task on that
cluster, asking for what the variant's benchmark asked (orchestrator/plan/placement.py): a
node's bench slot and all its CPUs, or a GPU. The task (entries.remeasure_entry) rebuilds the
pair on its node from the tracking store, so the store must be one every node reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.common.console import say
from orchestrator.plan.config import ClusterCfg
from orchestrator.plan.placement import bench_request, bench_threads
from orchestrator.run.rebuild import Unavailable, recorded_variant
from orchestrator.run.scheduler import Scheduler
from tasks.runtimes import runtime_module
from tasks.specs import ConfigError, Failure


@dataclass(frozen=True)
class RemeasureSpec:
    name: str  # the variant
    uri: str  # the tracking store both sweeps are in
    run_ids: dict[str, str]  # side (baseline, candidate) -> its run
    options: Any  # tasks.paired.PairOptions


def request(client: Any, run: Any, capacity: Any) -> Any:
    """What the variant's benchmark asks Ray for, from its recorded config."""
    v = recorded_variant(client, run)
    threads = bench_threads(capacity, v.device.name, v.bench.threads)
    memory_factor = runtime_module(v.backend.runtime).MEMORY_FACTOR
    return bench_request(capacity, v.device.name, threads, v.device.resources, v.weight_bytes, memory_factor, 0)


def on_cluster(
    client: Any, uri: str, address: str, runs: dict[str, dict[str, Any]], options: Any, done: Callable[[str, int, Any], None]
) -> None:
    """Each variant's pair ({name: {side: run}}) timed as a task on the cluster at `address`;
    done(name, its number, its PairResult or "not re-measured: why") as each ends."""
    number = {name: i for i, name in enumerate(runs, 1)}
    with Scheduler(ClusterCfg(address=address, fork_server=False, max_retries=0)) as sched:
        for name, sides in runs.items():
            try:
                placed = request(client, sides["candidate"], sched.capacity)
            except (Unavailable, ConfigError) as e:
                done(name, number[name], f"not re-measured: {e}")
                continue
            run_ids = {side: run.info.run_id for side, run in sides.items()}
            sched.submit("remeasure", name, RemeasureSpec(name, uri, run_ids, options), placed)
            say(f"[{number[name]}/{len(runs)}] {name}: queued on {address}, placed as its benchmark ({placed.options})")
        for kind, key, result in sched.results():
            if kind == "retry":
                say(f"{key}: retried ({result})")
            elif kind == "remeasure":
                if isinstance(result, Failure):
                    result = f"not re-measured: the task failed: {result.error}"
                done(key, number[key], result)
