"""Shared test settings and fixtures, each defined once here and imported by the test files:

- tiny model specs straight from conf/ (`model_spec`), the small test phases (PREFILL, DECODE);
- FAST_BENCH / FAST_OVERRIDES: the one shrunk measurement (as BenchOptions and as Hydra
  overrides) every test that benchmarks uses;
- `compose_jobs` / `plan_jobs`: conf/sweep.yaml composed once per job, shrunk (fast bench,
  small shapes), validated and planned exactly as a sweep plans it;
- one export cache for the whole test session (`export_cache`): `exported(...)` and
  `planned_variant(...)` fill it through the planner, so a sweep given `cluster.export_cache=`
  that folder (`cache_override`) finds the same entries, and each export is made once
  (`planned_variant.prefetch(...)` shares a module's exports with a background process).
- `mlflow_db(folder)`: an MLflow sqlite store whose tables are already made (a copy of one
  store MLflow made, kept per MLflow version in tests/.mlflow_store/).
- `sweep_in_tmp(*argv)`: `python sweep.py *argv` run in this process, in the test's tmp_path.
  `nothing_starts`: with it, the sweep starting MLflow or Ray fails the test (a refusal's check).
"""

from __future__ import annotations

import copy
import os
import signal
import sys
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from tasks.specs import BenchOptions, ModelSpec, PhaseSpec, resolve_attention

ROOT = Path(__file__).resolve().parent.parent


def interruptible() -> None:
    """Popen's preexec_fn for a sweep a test interrupts: SIGINT at its default in the child.
    A process started by a shell without job control (`cmd &` in a script, nohup, some CI
    runners) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def default_sigint():
    """SIGINT at Python's default in this process, whatever it inherited (a shell's background
    job, and so pytest and its workers, ignore it; the driver's handlers keep an ignored SIGINT
    ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


CONF = ROOT / "conf"


def in_session(sid: int) -> list[str]:
    """Live processes of session `sid` ("pid comm"), from /proc/<pid>/stat (field 6): what a
    test started in a session of its own left running (never the whole machine's)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(rest[3]) == sid and rest[0] not in ("Z", "X"):
            found.append(f"{stat.parent.name} {comm}")
    return found


BACKEND_NAMES = sorted(p.stem for p in (CONF / "backend").glob("*.yaml"))  # every backend= option


def backend_yaml(option: str) -> dict:
    """conf/backend/<option>.yaml with the yaml its defaults list names under it (one level, as
    onnxruntime_genai.yaml builds on onnxruntime.yaml), nested mappings merged."""
    y = yaml.safe_load((CONF / "backend" / f"{option}.yaml").read_text())
    merged: dict = {}
    for base in [d for d in y.pop("defaults", []) if d != "_self_"]:
        merged = yaml.safe_load((CONF / "backend" / f"{base}.yaml").read_text())
    for key, value in y.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return merged


def model_spec(name: str, **changes) -> ModelSpec:
    """The tiny preset of conf/model/<name>.yaml as a ModelSpec."""
    cfg = yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text())
    arch = dict(cfg["sizes"]["tiny"])
    fields = {k: cfg[k] for k in ("name", "family", "dtype", "seed", "kv_cache", "attention")}
    fields = {**fields, **changes}
    fields["attention"] = resolve_attention(fields["kv_cache"], fields["attention"])  # the yaml's auto
    return ModelSpec(size="tiny", arch=arch, **fields)


PREFILL = PhaseSpec("prefill", batch=2, prompt_len=16)
DECODE = PhaseSpec("decode", batch=2, context_len=24, parity_steps=8)
PHASES = {"prefill": PREFILL, "decode": DECODE}

# The one shrunk measurement: parity and the statistics' presence are what tests check, so
# the loop stops as soon as it may (a handful of calls, well under a second).
FAST_BENCH = BenchOptions(
    warmup_iters=2,
    warmup_max_seconds=1.0,
    min_iters=5,
    min_seconds=0.05,
    max_seconds=1.0,
    target_ci=10.0,
    threads=1,
    quality_tokens=32,
)


def _override(value) -> str:
    return "null" if value is None else str(value)


# FAST_BENCH as Hydra overrides, every field: a composed config's bench is FAST_BENCH exactly
FAST_OVERRIDES = [f"bench.{k}={_override(v)}" for k, v in asdict(FAST_BENCH).items()]
# PREFILL and DECODE as Hydra overrides: a sweep given these plans the same phases
SHAPE_OVERRIDES = [
    f"phase.batch={PREFILL.batch}",
    f"phase.prompt_len={PREFILL.prompt_len}",
    f"phase.context_len={DECODE.context_len}",
]  # DECODE.parity_steps is conf/phase/decode.yaml's
SHRINK = [*FAST_OVERRIDES, *SHAPE_OVERRIDES]
BACKEND_OF_FORMAT = {"onnx": "onnxruntime", "executorch": "executorch", "none": "eager"}


def capacity(cpus: int = 2, gpus: int = 0, memory_gib: int = 8):
    """A one-node cluster as the planner sees it (orchestrator.plan.placement.Capacity)."""
    from orchestrator.plan.placement import Capacity

    return Capacity(cpus=cpus, total_cpus=cpus, bench_slots=1, gpus=gpus, memory=memory_gib * 2**30)


class CaptureRunner:
    """A cluster that answers every capture (orchestrator.plan.capture.Runner, the planner's
    `runner`) with CaptureResult(key, True, **result); `specs`: what it was asked to capture."""

    def __init__(self, **result):
        self.result = result
        self.specs: dict[str, object] = {}
        self.queue: list[str] = []

    def submit(self, kind, key, spec, request):
        assert kind == "capture"
        self.specs[key] = spec
        self.queue.append(key)

    def results(self):
        from tasks.specs import CaptureResult

        while self.queue:
            key = self.queue.pop(0)
            yield "capture", key, CaptureResult(key, True, **self.result)


@lru_cache(maxsize=256)
def _composed(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("sweep", overrides=list(overrides))


def compose_jobs(*jobs: list[str] | tuple[str, ...], shrink: bool = True):
    """(configs, overrides) of a sweep of `jobs` (each a list of overrides), as the launcher
    hands them to orchestrator.run.sweep.run_sweep: conf/sweep.yaml composed once per distinct job
    a session (each caller gets its own copy), shrunk by SHRINK unless shrink=False."""
    overrides = [[*(SHRINK if shrink else ()), *job] for job in jobs]
    return [copy.deepcopy(_composed(tuple(o))) for o in overrides], overrides


def plan_jobs(*jobs: list[str] | tuple[str, ...], shrink: bool = True, cap=None):
    """compose_jobs -> validate_all -> make_plan: the Plan a sweep of `jobs` makes on `cap`."""
    from orchestrator.plan.config import validate_all
    from orchestrator.plan.planner import make_plan

    configs, overrides = compose_jobs(*jobs, shrink=shrink)
    return make_plan(validate_all(configs, overrides), configs, overrides, cap or capacity())


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory) -> Path:
    """The test session's one export cache: tests and sweeps alike fill and reuse it, in every
    test process (pytest-xdist's workers share it: an export is renamed into place complete)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (folder := shared / "export_cache").mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def cache_override(export_cache) -> str:
    return f"cluster.export_cache={export_cache}"


@pytest.fixture(scope="session")
def planned_variant(cache_override):
    """`planned_variant(*overrides)` -> (ExportResult, BenchSpec): one shrunk grid point,
    planned as a sweep plans it, its export made in the session's export cache (once a
    session: a sweep with `cache_override` and the same overrides finds it there).

    `planned_variant.prefetch(*jobs)` (each job a list of overrides, in the order the tests
    will ask for them) hands the exports not yet made to one background process, which makes
    them from the last one back; asked for one it has not started, this process makes it
    itself. Tests asking in order meet the background halfway: two cores export at once.
    Only while a core is idle: on a busy machine a second process would only add its own
    start-up (torch, transformers, executorch imports) to the work, so this process makes
    them all as they are asked for."""
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    from tasks.jobs import export_job

    made: dict[str, object] = {}  # export key -> ExportResult, or the Future of one

    def plan_one(overrides):
        plan = plan_jobs([*overrides, cache_override])
        assert not plan.skipped, plan.skipped
        (pv,) = plan.variants
        return pv, plan.exports[pv.export_key]

    def get(*overrides: str):
        pv, job = plan_one(overrides)
        result = made.get(pv.export_key)
        if isinstance(result, Future):
            result = result.result() if not result.cancel() else None  # not started there: made here
        if result is None:
            result = export_job(job.spec)
        assert result.ok, result.failure and result.failure.traceback
        made[pv.export_key] = result
        return result, pv.bench

    def prefetch(*jobs):
        todo = []
        for overrides in jobs:
            pv, job = plan_one(overrides)
            if pv.export_key not in made and not (Path(job.spec.out_dir) / "meta.json").is_file():
                todo.append((pv.export_key, job.spec))
        if not todo or os.getloadavg()[0] > (os.cpu_count() or 1) - 0.5:  # this process counts one
            return
        # spawned: nothing of this process (threads, torch state) is inherited
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        for key, spec in reversed(todo):
            made[key] = pool.submit(export_job, spec)
        pool.shutdown(wait=False)  # its process ends once the queue is done

    get.prefetch = prefetch
    return get


@pytest.fixture(scope="session")
def exported(planned_variant):
    """`exported(model, phase, fmt, kv_cache="static", **export_options)` -> ExportResult of
    the tiny model at PREFILL/DECODE's shapes, made once a session in the shared cache."""

    def get(model: str, phase: str, fmt: str, kv_cache: str = "static", **export_options):
        overrides = [f"model={model}", f"phase={phase}", f"backend={BACKEND_OF_FORMAT[fmt]}"]
        overrides.append(f"model.kv_cache={kv_cache}")
        overrides += [f"backend.export_options.{k}={_override(v)}" for k, v in export_options.items()]
        return planned_variant(*overrides)[0]

    return get


@pytest.fixture(scope="session")
def onnx_exports(exported):
    """ONNX exports of both tiny models, both phases: {(model, phase): ExportResult}."""
    return {(m, p): exported(m, p, "onnx") for m in ("llama", "phi3") for p in ("prefill", "decode")}


@pytest.fixture(scope="session")
def mlflow_db():
    """`mlflow_db(folder)` -> the sqlite URI of `folder`/mlflow.db: a file copy of one store
    MLflow made (its migrations take seconds), kept per MLflow version in tests/.mlflow_store/
    (ignored by git), so the migrations run once per checkout, not once per test process."""
    import shutil

    import mlflow
    from mlflow.tracking import MlflowClient

    kept = ROOT / "tests" / ".mlflow_store" / f"mlflow-{mlflow.__version__}.db"
    if not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        made = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")  # this process's own: xdist workers race
        made.unlink(missing_ok=True)
        here = Path.cwd()
        os.chdir(kept.parent)  # MLflow puts the Default experiment's artifacts under the working folder
        try:
            MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments(max_results=1)
        finally:
            os.chdir(here)
        os.replace(made, kept)  # whole or not at all: a racing worker's equal store may land first

    def copy_to(folder: Path) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, folder / "mlflow.db")
        return f"sqlite:///{folder / 'mlflow.db'}"

    return copy_to


@pytest.fixture
def sweep_app(monkeypatch):
    """`sweep_app(*argv)` runs sweep.py's Hydra app in this process, as `python sweep.py *argv`
    would; Hydra's global state and the logging it configures are restored after."""
    import logging
    import runpy
    import sys

    from hydra.core.global_hydra import GlobalHydra

    root, ours = logging.getLogger(), logging.getLogger("phasesweep")
    saved = root.level, root.handlers[:], ours.level, ours.handlers[:], ours.propagate
    GlobalHydra.instance().clear()
    # pytest's process only calls into phasesweep: sweep.py does not manage it (tasks/worker/heap.py)
    monkeypatch.setattr("tasks.worker.heap.manage_process", lambda: None)

    def app(*argv: str) -> None:
        monkeypatch.setattr(sys, "argv", ["sweep.py", *argv])
        runpy.run_path(str(ROOT / "sweep.py"), run_name="__main__")

    yield app
    GlobalHydra.instance().clear()
    for handler in {*root.handlers, *ours.handlers} - {*saved[1], *saved[3]}:
        handler.close()
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    ours.setLevel(saved[2])
    ours.handlers[:] = saved[3]
    ours.propagate = saved[4]


@pytest.fixture
def sweep_in_tmp(monkeypatch, tmp_path, sweep_app):
    """sweep_app, run in tmp_path: its store, outputs and multirun folders land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    return sweep_app


@pytest.fixture
def nothing_starts(monkeypatch):
    """The sweep's Tracker (MLflow) and Scheduler (Ray) fail the test if made: a sweep_app
    expected to refuse before any work starts neither in pytest's process."""
    import orchestrator.run.sweep as sweep

    def started(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} started before the config was refused")

        return fail

    monkeypatch.setattr(sweep, "Tracker", started("MLflow (Tracker)"))
    monkeypatch.setattr(sweep, "Scheduler", started("Ray (Scheduler)"))


@pytest.fixture(scope="module")
def hydra_loader():
    """(Hydra's config loader, the sweep's master config) as the launcher gets them."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        yield loader, loader.load_configuration("sweep", [], RunMode.MULTIRUN)
    GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    """torch.compile's caches emptied after each test: a sweep compiles each graph in a fresh
    process, while a test process compiles many models in turn, and dynamo's recompile limit
    (8 per code object: PhaseAttention.forward) would count them all."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and "torch._dynamo" in sys.modules:
        torch.compiler.reset()


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, MLflow, ...) frozen, as phasesweep's own
    processes freeze their imports (tasks/worker/heap.py): a full collection (export_job's
    among them) then walks only what the tests made, not a million long-lived objects."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def heap_stays_frozen():
    """A test that thaws the heap (checking gc.freeze itself) leaves it frozen again."""
    yield
    import gc

    if not gc.get_freeze_count():
        gc.collect()
        gc.freeze()


def pytest_xdist_make_scheduler(config, log):
    """The quick loop (-m "not slow") hands out tests one by one and steals at the tail: its
    module fixtures are cheap. The full suite keeps each file on one worker (--dist loadfile),
    so a module's cluster or sweep is made once."""
    if config.option.markexpr == "not slow" and config.option.dist == "loadfile":
        from xdist.scheduler import WorkStealingScheduling

        return WorkStealingScheduling(config, log)
    return None
