"""Placement rules, pure: a cluster's capacity from `ray.nodes()`-like dicts, and what
each task asks Ray for. No Ray here."""

from __future__ import annotations

import pytest

from orchestrator.plan.placement import (
    BENCH_RESOURCE,
    Capacity,
    bench_request,
    bench_threads,
    capacity_of,
    export_request,
    memory_warning,
    placement_error,
)
from tasks.specs import ConfigError

GiB = 2**30


def node(cpus: float, memory: int, gpus: float = 0, bench: bool = True, alive: bool = True) -> dict:
    """A node as `ray.nodes()` describes it (only the keys placement reads, plus some it ignores)."""
    resources = {"CPU": float(cpus), "memory": float(memory), "object_store_memory": 1e9, "node:10.0.0.1": 1.0}
    if gpus:
        resources["GPU"] = float(gpus)
    if bench:
        resources[BENCH_RESOURCE] = 1.0
    return {"NodeID": "x" * 56, "Alive": alive, "NodeManagerAddress": "10.0.0.1", "Resources": resources}


CAP = Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=0, memory=8 * GiB)


# -- capacity ---------------------------------------------------------------------------


def test_capacity_of_two_nodes_one_with_a_gpu():
    cap = capacity_of([node(16, 64 * GiB), node(8, 32 * GiB, gpus=2)])
    assert cap == Capacity(cpus=8, total_cpus=24, bench_slots=2, gpus=2, memory=64 * GiB)
    assert cap.limits == {"cpu": 24, "bench_cpu": 2, "gpu": 2}


def test_a_node_without_the_bench_resource_adds_cpus_not_bench_slots():
    cap = capacity_of([node(4, 16 * GiB), node(32, 128 * GiB, bench=False)])
    assert cap.cpus == 4  # threads and a CPU benchmark's reservation are sized on the nodes that run benchmarks
    assert cap.total_cpus == 36 and cap.bench_slots == 1
    assert cap.memory == 128 * GiB  # an export may still run on the big node


def test_dead_nodes_are_ignored():
    cap = capacity_of([node(4, 16 * GiB), node(64, 512 * GiB, gpus=8, alive=False)])
    assert cap == Capacity(cpus=4, total_cpus=4, bench_slots=1, gpus=0, memory=16 * GiB)


@pytest.mark.parametrize(
    "nodes", [[node(8, 32 * GiB, bench=False)], [node(8, 32 * GiB, alive=False)], []], ids=["no-bench", "dead", "none"]
)
def test_no_bench_node_names_cluster_address(nodes):
    with pytest.raises(ConfigError) as err:
        capacity_of(nodes, "ray://head:10001")
    text = str(err.value)
    assert "cluster.address='ray://head:10001'" in text and BENCH_RESOURCE in text and "scripts/cluster.sh" in text
    assert "head [NODE_IP] --bench" in text  # the head offers no bench slot unless asked


def test_limits_never_drop_to_zero():
    """A pool without workers still lets one task through (Ray then reports it pending)."""
    assert Capacity(cpus=2, total_cpus=0, bench_slots=1, gpus=0, memory=GiB).limits == {
        "cpu": 1,
        "bench_cpu": 1,
        "gpu": 1,
    }


# -- benchmarks ------------------------------------------------------------------------


def test_cpu_benchmarks_take_a_whole_node():
    threads = bench_threads(CAP, "cpu", None)  # bench.threads: null -> every core of a bench node
    assert threads == 2
    req = bench_request(CAP, "cpu", threads, {}, weight_bytes=0, memory_factor=1.5, max_retries=1)
    assert req.pool == "bench_cpu"
    assert req.options == {"max_retries": 1, "num_cpus": 2, "resources": {BENCH_RESOURCE: 1}}
    assert bench_threads(CAP, "cpu", 1) == 1


def test_a_one_thread_cpu_benchmark_still_reserves_the_whole_node():
    """No export runs on the other cores beside a 1-thread benchmark: it asks Ray for every
    CPU of the smallest bench node (and pins itself to one core of them, tasks/measure/machine.py)."""
    one = bench_request(CAP, "cpu", 1, {}, 0, 1.5, 0)
    assert one.pool == "bench_cpu"
    assert one.options == {"max_retries": 0, "num_cpus": 2, "resources": {BENCH_RESOURCE: 1}}
    big = Capacity(cpus=16, total_cpus=48, bench_slots=3, gpus=0, memory=64 * GiB)
    for threads in (1, 4, 16):
        assert bench_request(big, "cpu", threads, {}, 0, 1.5, 1).options["num_cpus"] == 16


def test_more_threads_than_a_bench_node_has_cpus_is_a_config_error():
    with pytest.raises(ConfigError, match="bench.threads=8 exceeds the 2 CPUs of the smallest benchmark node"):
        bench_request(CAP, "cpu", 8, {}, 0, 1.5, 1)
    assert bench_request(CAP, "cpu", 2, {}, 0, 1.5, 1).options["num_cpus"] == 2  # exactly a node is fine


def test_cuda_benchmarks_take_one_gpu_not_the_bench_slot():
    assert bench_threads(CAP, "cuda", None) == 1
    req = bench_request(CAP, "cuda", 1, {"num_gpus": 1}, weight_bytes=0, memory_factor=1.5, max_retries=2)
    assert req.pool == "gpu"
    assert req.options == {"max_retries": 2, "num_gpus": 1, "num_cpus": 1, "resources": {}}
    default = bench_request(CAP, "cuda", 1, {}, 0, 1.5, 1)  # a device yaml without resources still gets its GPU
    assert default.options["num_gpus"] == 1 and BENCH_RESOURCE not in default.options["resources"]
    # threads are not checked against the CPUs of a bench node: a GPU benchmark does not use them
    assert bench_request(CAP, "cuda", 64, {}, 0, 1.5, 1).options["num_cpus"] == 1


def test_device_resources_pass_through():
    req = bench_request(CAP, "cpu", 2, {"memory": 3 * GiB, "accelerator_type:A100": 0.1}, GiB, 1.5, 1)
    assert req.options["memory"] == 3 * GiB  # the device yaml's memory wins over the estimate
    assert req.options["resources"] == {BENCH_RESOURCE: 1, "accelerator_type:A100": 0.1}


def test_memory_requests_follow_model_size():
    req = bench_request(CAP, "cpu", 1, {}, weight_bytes=2 * GiB, memory_factor=1.5, max_retries=1)
    assert req.options["memory"] == 3 * GiB
    big = bench_request(CAP, "cpu", 1, {}, weight_bytes=6 * GiB, memory_factor=1.5, max_retries=1)
    assert big.options["memory"] == 8 * GiB  # capped at the largest node: the task then runs alone there
    assert "memory" not in bench_request(CAP, "cpu", 1, {}, 0, 1.5, 1).options  # unknown size: no request


# -- exports ---------------------------------------------------------------------------


def test_export_request_uses_the_formats_resources():
    req = export_request(CAP, {"num_cpus": 1}, weight_bytes=GiB, memory_factor=4.0, max_retries=1)
    assert req.pool == "cpu" and req.options == {"num_cpus": 1, "max_retries": 1, "memory": 4 * GiB}
    gpu = export_request(CAP, {"num_gpus": 1}, weight_bytes=0, memory_factor=1.5, max_retries=0)
    assert gpu.pool == "gpu" and gpu.options == {"num_cpus": 1, "num_gpus": 1, "max_retries": 0}
    heavy = export_request(CAP, {"num_cpus": 4}, weight_bytes=4 * GiB, memory_factor=4.0, max_retries=1)
    assert heavy.options["num_cpus"] == 4 and heavy.options["memory"] == 8 * GiB  # capped at a node


# -- what cannot fit -------------------------------------------------------------------


def test_placement_error():
    assert placement_error(CAP, "cpu", GiB) is None
    assert placement_error(CAP, "cpu", 8 * GiB) is None  # exactly a node: runs alone
    assert placement_error(CAP, "cpu", 9 * GiB) == (
        "its 9.0 GiB of weights exceed the 8.0 GiB of memory the largest node offers Ray"
    )
    assert placement_error(CAP, "cuda", GiB) == "device=cuda needs a GPU and no node of this Ray cluster has one"
    with_gpu = Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=1, memory=8 * GiB)
    assert placement_error(with_gpu, "cuda", GiB) is None


def test_memory_warning():
    assert memory_warning(CAP, 2 * GiB, "onnx", 1.5) is None  # 3 GiB at peak
    assert memory_warning(CAP, 2 * GiB, "executorch", 4.0) is None  # 8 GiB: exactly a node
    text = memory_warning(CAP, 4 * GiB, "executorch", 4.0)
    assert text.startswith("may not fit:") and "executorch export of 4.0 GiB of weights peaks near 16.0 GiB" in text
    assert "the largest node offers Ray 8.0 GiB (it runs alone on that node)" in text
