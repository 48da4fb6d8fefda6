"""Placement rules, pure (no Ray): what a cluster can hold and what each task asks Ray for.

- An export asks for its format's RESOURCES and MEMORY_FACTOR x the weights of memory.
- A CPU benchmark asks for its node's bench slot and all the CPUs of the smallest bench node,
  so nothing of the sweep runs beside it; a CUDA benchmark asks for one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.specs import ConfigError

BENCH_RESOURCE = "phasesweep_bench"
GiB = 2**30


@dataclass(frozen=True)
class Capacity:
    cpus: int  # CPUs of the smallest node offering a bench slot
    total_cpus: int
    bench_slots: int
    gpus: int
    memory: int  # bytes Ray may hand out on the largest node

    @property
    def limits(self) -> dict[str, int]:
        """How many tasks of each pool may run at once."""
        return {"cpu": max(1, self.total_cpus), "bench_cpu": self.bench_slots, "gpu": max(1, self.gpus)}


@dataclass(frozen=True)
class Request:
    """One task's Ray options and the pool whose limit it counts against."""

    options: dict[str, Any] = field(default_factory=dict)
    pool: str = "cpu"  # "cpu" | "bench_cpu" | "gpu"


def capacity_of(nodes: list[dict[str, Any]], address: str | None = None) -> Capacity:
    """The capacity of the alive nodes, as `ray.nodes()` describes them."""
    alive = [n for n in nodes if n.get("Alive")]
    bench = [n for n in alive if n["Resources"].get(BENCH_RESOURCE, 0) >= 1]
    if not bench:
        raise ConfigError(
            f"cluster.address={address!r}: no node offers the resource {BENCH_RESOURCE}; "
            "start workers with scripts/cluster.sh worker HEAD_IP:GCS_PORT, or let the head benchmark too with "
            f"scripts/cluster.sh head [NODE_IP] --bench (ray start --resources='{{\"{BENCH_RESOURCE}\": 1}}')"
        )
    return Capacity(
        cpus=int(min(n["Resources"].get("CPU", 1) for n in bench)),
        total_cpus=int(sum(n["Resources"].get("CPU", 0) for n in alive)),
        bench_slots=len(bench),
        gpus=int(sum(n["Resources"].get("GPU", 0) for n in alive)),
        memory=int(max(n["Resources"].get("memory", 0) for n in alive)),
    )


def bench_threads(cap: Capacity, device: str, threads: int | None) -> int:
    """Threads a benchmark uses: as configured, else every core of a bench node (CPU)."""
    return threads or (cap.cpus if device == "cpu" else 1)


def _memory(cap: Capacity, need: int) -> int:
    """A request Ray can grant: at most a whole node's memory (the task then runs alone)."""
    return min(need, cap.memory)


def bench_request(
    cap: Capacity,
    device: str,
    threads: int,
    extra: dict[str, Any],
    weight_bytes: int,
    memory_factor: float,
    max_retries: int,
) -> Request:
    extra = dict(extra)
    opts: dict[str, Any] = {"max_retries": max_retries}
    if weight_bytes:
        opts["memory"] = _memory(cap, int(weight_bytes * memory_factor))
    for key in ("num_gpus", "memory"):
        if key in extra:
            opts[key] = extra.pop(key)
    if device == "cuda":
        opts.setdefault("num_gpus", 1)
        opts.update(num_cpus=1, resources=extra)
        return Request(opts, "gpu")
    if threads > cap.cpus:
        raise ConfigError(f"bench.threads={threads} exceeds the {cap.cpus} CPUs of the smallest benchmark node")
    opts.update(num_cpus=cap.cpus, resources={BENCH_RESOURCE: 1, **extra})  # the whole node, quiet
    return Request(opts, "bench_cpu")


def export_request(
    cap: Capacity, resources: dict[str, Any], weight_bytes: int, memory_factor: float, max_retries: int
) -> Request:
    opts: dict[str, Any] = {"num_cpus": 1, **resources, "max_retries": max_retries}
    if weight_bytes:
        opts["memory"] = _memory(cap, int(weight_bytes * memory_factor))
    return Request(opts, "gpu" if opts.get("num_gpus") else "cpu")


def placement_error(cap: Capacity, device: str, weight_bytes: int) -> str | None:
    """Why no node of this cluster can run this variant at all, or None."""
    if device == "cuda" and cap.gpus == 0:
        return "device=cuda needs a GPU and no node of this Ray cluster has one"
    if weight_bytes > cap.memory:
        return (
            f"its {weight_bytes / GiB:.1f} GiB of weights exceed the {cap.memory / GiB:.1f} GiB "
            "of memory the largest node offers Ray"
        )
    return None


def memory_warning(cap: Capacity, weight_bytes: int, export_format: str, peak_factor: float) -> str | None:
    need = int(weight_bytes * peak_factor)
    if need <= cap.memory:
        return None
    return (
        f"may not fit: a {export_format} export of {weight_bytes / GiB:.1f} GiB of weights peaks near "
        f"{need / GiB:.1f} GiB, the largest node offers Ray {cap.memory / GiB:.1f} GiB "
        "(it runs alone on that node)"
    )


def capacity_text(cap: Capacity) -> str:
    return (
        f"{cap.total_cpus} CPU(s), {cap.bench_slots} bench slot(s) of {cap.cpus} CPU(s), {cap.gpus} GPU(s), "
        f"{cap.memory / GiB:.1f} GiB for tasks on the largest node"
    )
