"""Grid control (orchestrator/plan/grid.py): include/exclude rules and a cap of variants per model,
applied when the grid is planned, each excluded point listed with its rule; rules checked
before anything runs, their errors naming the key, the value and what is allowed. And the
dry run that shows it all: the plan, nothing run, no Ray started, no store created."""

from __future__ import annotations

import itertools
import sys

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from orchestrator.plan.compose import JobConfigs
from orchestrator.plan.config import ConfigError, TrackingCfg, validate_all
from orchestrator.plan.grid import grid_rules
from orchestrator.plan.planner import make_plan
from orchestrator.read.summary import plan_text
from tests.conftest import BACKEND_NAMES, CONF, capacity

BACKENDS = BACKEND_NAMES

GROUP_OPTIONS = {
    "model": ["llama", "phi3"],
    "phase": ["decode", "prefill"],
    "backend": BACKENDS,
    "device": ["cpu", "cuda"],
}


@pytest.fixture(scope="module")
def plan_grid():
    """`plan_grid(rules, **axes)`: the Plan of the sweep `-m key=a,b ...` with grid rules
    (`rules`: the launcher's include/exclude/max_variants as a dict)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("sweep", [], RunMode.MULTIRUN)

        def plan(rules: dict | None = None, **axes: str):
            keys = [k.replace("__", ".") for k in axes]
            jobs = [
                [f"{k}={v}" for k, v in zip(keys, c, strict=True)]
                for c in itertools.product(*(a.split(",") for a in axes.values()))
            ]
            configs = JobConfigs(loader, master, jobs)
            points = validate_all(configs, jobs)
            return make_plan(points, configs, jobs, capacity(), grid_rules(**(rules or {}), groups=GROUP_OPTIONS))

        yield plan
    GlobalHydra.instance().clear()


def names(plan):
    return [pv.name for pv in plan.variants]


def test_exclude_rule_leaves_out_matching_points_with_the_rule(plan_grid):
    plan = plan_grid(
        {"exclude": [{"backend": "executorch", "device": "cuda"}]},
        backend="eager,executorch",
        device="cpu,cuda",
    )
    assert names(plan) == ["llama_prefill_eager_cpu", "llama_prefill_eager_cuda", "llama_prefill_executorch_cpu"]
    assert not plan.skipped  # excluded, not planned as a skipped run
    (e,) = plan.excluded
    assert e.jobs == (3,) and e.name == "llama_prefill_executorch_cuda"
    assert e.rule == "hydra.launcher.exclude[0] {backend: executorch, device: cuda}"
    assert (
        "llama_prefill_executorch_cuda (job #3)  hydra.launcher.exclude[0] {backend: executorch, device: cuda}"
        in plan_text(plan)
    )


def test_rules_take_lists_and_dotted_keys(plan_grid):
    plan = plan_grid(
        {"exclude": [{"phase": "decode", "phase.context_len": [256, 512]}, {"model.dtype": "float16"}]},
        phase="prefill,decode",
        phase__context_len="128,256,512",
        model__dtype="float32,float16",
    )
    assert names(plan) == ["llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu"]
    rules = {e.rule for e in plan.excluded}
    assert rules == {
        "hydra.launcher.exclude[0] {phase: decode, phase.context_len: [256, 512]}",
        "hydra.launcher.exclude[1] {model.dtype: float16}",
    }


def test_include_keeps_only_matching_points(plan_grid):
    plan = plan_grid(
        {"include": [{"model": "phi3"}, {"model": "llama", "phase": "decode"}]},
        model="llama,phi3",
        phase="prefill,decode",
    )
    assert names(plan) == [
        "llama_decode_onnxruntime_cpu",
        "phi3_prefill_onnxruntime_cpu",
        "phi3_decode_onnxruntime_cpu",
    ]
    (e,) = plan.excluded
    assert e.name == "llama_prefill_onnxruntime_cpu" and e.rule == "matches no rule of hydra.launcher.include (2)"


def test_max_variants_caps_each_model_in_grid_order(plan_grid):
    plan = plan_grid({"max_variants": 2}, model="llama,phi3", phase__batch="1,2,3")
    assert names(plan) == [
        "llama_prefill_onnxruntime_cpu_b1",
        "llama_prefill_onnxruntime_cpu_b2",
        "phi3_prefill_onnxruntime_cpu_b1",
        "phi3_prefill_onnxruntime_cpu_b2",
    ]
    assert [(e.jobs, e.rule) for e in plan.excluded] == [
        ((2,), "hydra.launcher.max_variants=2: model llama has 2 variant(s) already"),
        ((5,), "hydra.launcher.max_variants=2: model phi3 has 2 variant(s) already"),
    ]


def test_max_variants_counts_variants_not_jobs(plan_grid):
    """Jobs that are one variant (context length swept over prefill) count once; names say
    what varies among the variants planned."""
    plan = plan_grid({"max_variants": 2}, phase="prefill,decode", phase__context_len="128,256")
    assert names(plan) == ["llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu"]
    assert plan.variants[0].jobs == (0, 1)
    assert [e.jobs for e in plan.excluded] == [(3,)]


@pytest.mark.parametrize(
    "rules,message",
    [
        (
            {"exclude": [{"bakend": "eager"}]},
            "hydra.launcher.exclude[0]: bakend is not a known key; allowed keys: model, phase, backend, device, or a "
            "dotted key of model.*, phase.*, backend.*, device.*, bench.*, env.* (e.g. phase.context_len)",
        ),
        (
            {"exclude": [{"backend": "executorh"}]},
            f"hydra.launcher.exclude[0]: backend='executorh' is not allowed; choose one of: {', '.join(BACKENDS)}",
        ),
        (
            {"include": [{"model": "llama"}, {"model.dtype": ["float32", "fp8"]}]},
            "hydra.launcher.include[1]: model.dtype='fp8' is not allowed; choose one of: float32, float16, bfloat16",
        ),
        (
            {"exclude": [{"phase.context": 4096}]},
            "hydra.launcher.exclude[0]: phase.context is not a known key; allowed keys: phase.name, phase.batch, "
            "phase.prompt_len, phase.context_len, phase.cache_len, phase.parity_steps, phase.seed",
        ),
        ({"exclude": [{}]}, "hydra.launcher.exclude[0]={} is not a rule: give a mapping of keys to values"),
        ({"exclude": {"backend": "eager"}}, "hydra.launcher.exclude={backend: eager} is not a list of rules"),
        ({"max_variants": 0}, "hydra.launcher.max_variants=0 must be an integer >= 1 (or null: no cap)"),
        ({"exclude": [{"device": []}]}, "hydra.launcher.exclude[0]: device=[] matches nothing"),
    ],
)
def test_bad_rules_name_key_value_and_allowed(rules, message):
    with pytest.raises(ConfigError) as err:
        grid_rules(**rules, groups=GROUP_OPTIONS)
    assert message in str(err.value)


def test_plan_text_counts_the_runs_a_store_already_holds(plan_grid):
    plan = plan_grid(phase="prefill,decode")
    prefill, decode = plan.variants
    existing = {prefill.variant.bench_key: ["failed", "ok"], "other": ["ok"]}
    rows = {line.split()[0]: line for line in plan_text(plan, existing).splitlines() if line.strip()}
    assert "  2 (1 ok), reused" in rows[prefill.name]
    assert rows[decode.name].endswith("  0")  # runs: none; no note
    assert ", reused" not in plan_text(plan, existing, resume=False)


def test_existing_runs_reads_a_store_and_creates_none(tmp_path, mlflow_db):
    from orchestrator.record.tracking import existing_runs

    absent = tmp_path / "absent" / "mlflow.db"
    assert existing_runs(TrackingCfg(uri=f"sqlite:///{absent}")) == {}
    assert not absent.exists() and not absent.parent.exists()

    from mlflow.tracking import MlflowClient

    uri = mlflow_db(tmp_path / "store")
    client = MlflowClient(tracking_uri=uri)
    assert existing_runs(TrackingCfg(uri=uri, experiment="phasesweep")) == {}  # no experiment yet: none made
    assert client.get_experiment_by_name("phasesweep") is None
    exp = client.create_experiment("phasesweep")
    for status, state in (("failed", "FAILED"), ("ok", "FINISHED")):
        run = client.create_run(exp, tags={"phasesweep.role": "variant", "bench_key": "k1", "status": status})
        client.set_terminated(run.info.run_id, state)
    assert existing_runs(TrackingCfg(uri=uri, experiment="phasesweep")) == {"k1": ["failed", "ok"]}


# -- through the launcher ---------------------------------------------------------------------


@pytest.mark.parametrize("code, status", [("UNAUTHENTICATED", "401 not authenticated"), ("PERMISSION_DENIED", "403")])
def test_a_server_that_refuses_the_credentials_is_one_line_for_the_dry_run_too(monkeypatch, code, status):
    """existing_runs (the dry run's runs column) reads a server as a sweep does: a refusal is
    refused()'s one line naming the server, not MLflow's traceback."""
    import mlflow.tracking
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    from orchestrator.record import tracking

    class Refusing:
        def __init__(self, tracking_uri):
            pass

        def get_experiment_by_name(self, name):
            raise MlflowException("refused", error_code=getattr(databricks_pb2, code))

    monkeypatch.setattr(tracking, "check_reachable", lambda uri: None)
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Refusing)
    with pytest.raises(ConfigError) as e:
        tracking.existing_runs(TrackingCfg(uri="http://127.0.0.1:9"))
    assert str(e.value).startswith("tracking.uri='http://127.0.0.1:9' refused") and status in str(e.value)


def test_dry_run_prints_the_plan_with_exclusions_and_runs_nothing(sweep_in_tmp, tmp_path, capsys):
    sweep_in_tmp(
        "-m",
        "model=llama,phi3",
        "backend=onnxruntime,executorch",
        "device=cpu,cuda",
        "hydra.launcher.dry_run=true",
        "hydra.launcher.exclude=[{backend: executorch, device: cuda}]",
        "hydra.launcher.max_variants=2",
    )
    out = capsys.readouterr().out
    assert "phasesweep: 4 variant(s), 2 export(s), 0 skipped, 4 excluded" in out
    assert "  excluded  2 job(s): hydra.launcher.exclude[0] {backend: executorch, device: cuda}" in out
    for model in ("llama", "phi3"):
        assert f"  excluded  1 job(s): hydra.launcher.max_variants=2: model {model} has 2 variant(s) already" in out
    assert "dry run: planned for this machine as a local Ray would offer it (not started)" in out
    assert "dry run: no runs in sqlite:///" in out
    for name in ("llama_prefill_onnxruntime_cpu", "llama_prefill_onnxruntime_cuda", "phi3_prefill_onnxruntime_cpu"):
        assert name in out
    assert "phasesweep_bench=1 [bench_cpu]" in out and "[gpu]" in out  # each benchmark's resources
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_a_bad_rule_stops_the_sweep_before_anything_runs(sweep_in_tmp, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        sweep_in_tmp("-m", "model=llama,phi3", "hydra.launcher.exclude=[{backend: tensorrt}]")
    assert exit_.value.code == (
        "phasesweep: hydra.launcher.exclude[0]: backend='tensorrt' is not allowed; choose one of: "
        + ", ".join(BACKENDS)
    )
    assert not (tmp_path / "mlflow.db").exists()


def test_pair_makes_a_b_pairs_of_variants_equal_in_all_else(plan_grid):
    """hydra.launcher.pair: the value given first is the baseline; one pair per rest-of-grid point."""
    plan = plan_grid({"pair": "model.kv_cache"}, model__kv_cache="dynamic,static", phase="prefill,decode")
    by_name = {pv.name: pv.variant for pv in plan.variants}
    assert len(plan.pairs) == 2
    for a, b in plan.pairs:
        va, vb = by_name[a], by_name[b]
        assert (va.model.kv_cache, vb.model.kv_cache) == ("dynamic", "static")
        assert va.phase.name == vb.phase.name and va.backend == vb.backend  # a static cache adds its capacity


@pytest.mark.parametrize(
    ("rules", "axes", "message"),
    [
        ({"pair": "model.kv_cache"}, {"phase": "prefill,decode"}, "needs exactly two values of model.kv_cache in the grid, it has 1 (static)"),
        ({"pair": "phase.batch"}, {"phase__batch": "1,2,4"}, "needs exactly two values of phase.batch in the grid, it has 3 (1, 2, 4)"),
        ({"pair": "phase.contxt"}, {"phase": "decode"}, "hydra.launcher.pair: phase.contxt is not a known key"),
    ],
)
def test_a_pair_key_that_makes_no_pair_is_refused_before_work(plan_grid, rules, axes, message):
    with pytest.raises(ConfigError) as err:
        plan_grid(rules, **axes)
    assert message in str(err.value)
