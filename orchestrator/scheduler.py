"""Ray: start or join, per-task resources, one benchmark per node, timeouts, retries.

Exports run on one CPU each. A CPU benchmark asks for the node's bench slot (the custom
resource `phasesweep_bench`, one per node) and for as many CPUs as it uses threads, so
two CPU benchmarks never share a node and no export runs beside one on its cores. A CUDA
benchmark asks for one GPU. Each benchmark runs in a fresh worker process (max_calls=1).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import ClusterCfg, ConfigError
from tasks.specs import Failure

BENCH_RESOURCE = "phasesweep_bench"
# Memory a task asks Ray for, as multiples of the model's weight bytes, so that large
# models are never placed where they cannot fit. Peak RSS measured on the Llama-3.2-1B
# architecture in fp32 (4.9 GB of weights): ONNX export 6.2 GB (1.3x), ExecuTorch export
# 18.4 GB (3.7x), ONNX Runtime benchmark 6.8 GB (1.4x).
EXPORT_MEMORY_FACTOR = {"none": 1.5, "onnx": 1.5, "executorch": 4.0}
BENCH_MEMORY_FACTOR = 1.5


def export_memory(weight_bytes: int, export_format: str) -> int:
    return int(weight_bytes * EXPORT_MEMORY_FACTOR[export_format])


# Environment for a local Ray, set before ray is first imported (Ray reads it at import):
# - RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps the node IP on loopback, so gcs_server,
#   raylet, workers and agents bind 127.0.0.1 only (with _node_ip_address alone Ray
#   resolves 127.0.0.1 to the machine's routable IP and binds every interface);
# - RAY_AUTH_MODE=token keeps token auth on, stated rather than warned about;
# - no usage statistics leave the machine.
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}


def _import_ray_on_loopback():
    """Import ray so that a local instance listens on loopback only."""
    import sys

    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    already = "ray" in sys.modules
    import ray

    if already:  # imported before our environment was set: apply the same switch directly
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] not in ("0", "false")
    return ray


def _export_entry(spec):
    from tasks.jobs import export_job  # heavy imports happen on the worker

    return export_job(spec)


def _bench_entry(spec):
    from tasks.jobs import bench_job

    return bench_job(spec)


@dataclass
class _Task:
    kind: str  # "export" | "bench"
    key: str  # export key or variant name
    spec: Any
    options: dict[str, Any]
    pool: str  # which capacity it counts against: "cpu", "bench_cpu", "bench_gpu"
    ref: Any = None
    started: float = 0.0


@dataclass
class Capacity:
    cpus: int  # CPUs of the smallest node offering a bench slot
    total_cpus: int
    bench_slots: int
    gpus: int
    memory: int  # bytes Ray may hand out on the largest node
    limits: dict[str, int] = field(default_factory=dict)


class Scheduler:
    def __init__(self, cluster: ClusterCfg):
        self.cluster = cluster
        self.owned = False
        self.queue: deque[_Task] = deque()
        self.running: dict[Any, _Task] = {}

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        local = self.cluster.address is None
        if local:
            ray = _import_ray_on_loopback()
        else:
            import ray

        if not ray.is_initialized():
            common = {"log_to_driver": False, "logging_level": "warning", "configure_logging": True}
            if local:
                ray.init(
                    num_cpus=self.cluster.num_cpus or os.cpu_count(),
                    resources={BENCH_RESOURCE: 1},
                    include_dashboard=self.cluster.dashboard,
                    dashboard_host="127.0.0.1",
                    _node_ip_address="127.0.0.1",
                    **common,
                )
            else:
                ray.init(address=self.cluster.address, **common)
            self.owned = True
        self._export = ray.remote(_export_entry)
        self._bench = ray.remote(max_calls=1)(_bench_entry)
        self.capacity = self._capacity()

    def stop(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()
            self.owned = False

    def _capacity(self) -> Capacity:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        bench_nodes = [n for n in nodes if n["Resources"].get(BENCH_RESOURCE, 0) >= 1]
        if not bench_nodes:
            raise ConfigError(
                f"cluster.address={self.cluster.address!r}: no node offers the resource {BENCH_RESOURCE}; "
                f"start nodes with scripts/cluster.sh (ray start --resources='{{\"{BENCH_RESOURCE}\": 1}}')"
            )
        total_cpus = int(sum(n["Resources"].get("CPU", 0) for n in nodes))
        cap = Capacity(
            cpus=int(min(n["Resources"].get("CPU", 1) for n in bench_nodes)),
            total_cpus=total_cpus,
            bench_slots=len(bench_nodes),
            gpus=int(sum(n["Resources"].get("GPU", 0) for n in nodes)),
            memory=int(max(n["Resources"].get("memory", 0) for n in nodes)),
        )
        cap.limits = {"cpu": max(1, total_cpus), "bench_cpu": cap.bench_slots, "bench_gpu": max(1, cap.gpus)}
        return cap

    # -- resources -------------------------------------------------------------------
    def bench_threads(self, device: str, threads: int | None) -> int:
        """Threads a benchmark uses: as configured, else every core of a bench node (CPU)."""
        return threads or (self.capacity.cpus if device == "cpu" else 1)

    def placement_error(self, device: str, weight_bytes: int) -> str | None:
        """Why no node of this cluster can run this variant at all, or None."""
        if device == "cuda" and self.capacity.gpus == 0:
            return "device=cuda needs a GPU and no node of this Ray cluster has one"
        if weight_bytes > self.capacity.memory:
            return (
                f"its {weight_bytes / 2**30:.1f} GiB of weights exceed the {self.capacity.memory / 2**30:.1f} GiB "
                "of memory the largest node offers Ray"
            )
        return None

    def memory_warning(self, weight_bytes: int, export_format: str) -> str | None:
        need = max(export_memory(weight_bytes, export_format), int(weight_bytes * BENCH_MEMORY_FACTOR))
        if need <= self.capacity.memory:
            return None
        return (
            f"may not fit: a {export_format} export of {weight_bytes / 2**30:.1f} GiB of weights peaks near "
            f"{need / 2**30:.1f} GiB, the largest node offers Ray {self.capacity.memory / 2**30:.1f} GiB "
            "(it runs alone on that node)"
        )

    def _memory(self, need: int) -> int:
        """A request Ray can grant: at most a whole node's memory (the task then runs alone)."""
        return min(need, self.capacity.memory)

    def bench_options(
        self, device: str, threads: int, extra: dict[str, Any], weight_bytes: int = 0
    ) -> tuple[dict[str, Any], str]:
        extra = dict(extra)
        opts: dict[str, Any] = {"max_retries": self.cluster.max_retries}
        if weight_bytes:
            opts["memory"] = self._memory(int(weight_bytes * BENCH_MEMORY_FACTOR))
        for key in ("num_gpus", "memory"):
            if key in extra:
                opts[key] = extra.pop(key)
        if device == "cuda":
            opts.setdefault("num_gpus", 1)
            opts.update(num_cpus=1, resources=extra)
            return opts, "bench_gpu"
        if threads > self.capacity.cpus:
            raise ConfigError(
                f"bench.threads={threads} exceeds the {self.capacity.cpus} CPUs of the smallest benchmark node"
            )
        opts.update(num_cpus=threads, resources={BENCH_RESOURCE: 1, **extra})
        return opts, "bench_cpu"

    # -- running ---------------------------------------------------------------------
    def submit_export(self, key: str, spec: Any, weight_bytes: int = 0) -> None:
        opts = {"num_cpus": 1, "max_retries": self.cluster.max_retries}
        if weight_bytes:  # two large exports never share a node that cannot hold both
            opts["memory"] = self._memory(export_memory(weight_bytes, spec.export_format))
        self.queue.append(_Task("export", key, spec, opts, "cpu"))

    def submit_bench(self, name: str, spec: Any, options: dict[str, Any], pool: str) -> None:
        self.queue.append(_Task("bench", name, spec, options, pool))

    def _in_use(self, pool: str) -> int:
        return sum(1 for t in self.running.values() if t.pool == pool)

    def _start_queued(self) -> None:
        """Hand Ray only what can start now, so a task's clock measures its own run."""
        for task in list(self.queue):
            if self._in_use(task.pool) >= self.capacity.limits[task.pool]:
                continue
            fn = self._export if task.kind == "export" else self._bench
            task.ref = fn.options(**task.options).remote(task.spec)
            task.started = time.monotonic()
            self.running[task.ref] = task
            self.queue.remove(task)

    def results(self) -> Iterator[tuple[str, str, Any]]:
        """Yield (kind, key, result | Failure) as tasks end; more may be submitted meanwhile."""
        import ray
        from ray.exceptions import RayError

        while self.queue or self.running:
            self._start_queued()
            ready, _ = ray.wait(list(self.running), num_returns=1, timeout=1.0)
            for ref in ready:
                task = self.running.pop(ref)
                try:
                    yield task.kind, task.key, ray.get(ref)
                except RayError as e:  # the worker died, ran out of memory, or was cancelled
                    stage = "export" if task.kind == "export" else "benchmark"
                    yield task.kind, task.key, Failure(stage, f"{type(e).__name__}: {str(e).splitlines()[0]}", str(e))
            now = time.monotonic()
            for ref, task in list(self.running.items()):
                if now - task.started > self.cluster.task_timeout_s:
                    ray.cancel(ref, force=True)
                    del self.running[ref]
                    stage = "export" if task.kind == "export" else "benchmark"
                    msg = f"timed out after {self.cluster.task_timeout_s:g}s (cluster.task_timeout_s)"
                    yield task.kind, task.key, Failure(stage, msg)
