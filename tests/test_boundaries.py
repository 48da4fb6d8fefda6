"""The boundaries the design rests on, checked on the source and on a real driver process:

- orchestrator/ never imports torch (nor transformers, onnxruntime, executorch): the
  driver validates and plans a whole grid with none of them loaded;
- tasks/ never imports Ray, MLflow or Hydra;
- a Ray worker loads the task entries without the driver's libraries (MLflow, Hydra, OmegaConf);
- nothing outside a phase's own module branches on the phase's name.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tasks.phases import phase_names
from tests.conftest import CONF, ROOT

ACCELERATOR_STACK = ("torch", "transformers", "onnxruntime", "onnx", "onnxscript", "executorch", "torchao")
DRIVER_ONLY = ("ray", "mlflow", "hydra", "omegaconf")


def sources(*folders: str, exclude: str | None = None) -> list[Path]:
    files = [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]
    return [p for p in files if not (exclude and p.is_relative_to(ROOT / exclude))]


def imported_roots(path: Path) -> set[str]:
    """Top-level packages a file imports anywhere (module level or inside functions)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_orchestrator_source_never_imports_the_accelerator_stack():
    found = {
        str(p.relative_to(ROOT)): sorted(imported_roots(p) & set(ACCELERATOR_STACK))
        for p in sources("orchestrator", "hydra_plugins")
    }
    assert not {k: v for k, v in found.items() if v}


def test_tasks_never_import_ray_mlflow_or_hydra():
    found = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & set(DRIVER_ONLY)) for p in sources("tasks")}
    assert not {k: v for k, v in found.items() if v}


# validate and plan a grid of every backend and both phases, in a fresh interpreter
DRIVER = """
import itertools, json, sys
import orchestrator.plan.config, orchestrator.plan.planner, orchestrator.run.sweep, orchestrator.launcher
import hydra_plugins.phasesweep_launcher.ray_launcher
from hydra import compose, initialize_config_dir
from orchestrator.plan.config import validate_all
from orchestrator.plan.placement import Capacity
from orchestrator.plan.planner import make_plan

axes = json.loads(sys.argv[1])
jobs = [[f"{k}={v}" for k, v in zip(axes, combo)] for combo in itertools.product(*axes.values())]
jobs = [job + ["phase.app=examples.generate_app:run"] if "phase=captured" in job else job for job in jobs]  # planned as a dry run does
with initialize_config_dir(config_dir=sys.argv[2], version_base="1.3"):
    configs = [compose("sweep", overrides=job) for job in jobs]
points = validate_all(configs, jobs)
plan = make_plan(points, configs, jobs, Capacity(cpus=2, total_cpus=2, bench_slots=1, gpus=0, memory=8 * 2**30))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[3]))
print(json.dumps({"variants": len(plan.variants), "exports": len(plan.exports), "heavy": heavy}))
"""


def test_driver_validates_and_plans_every_backend_without_the_accelerator_stack():
    backends = sorted(p.stem for p in (CONF / "backend").glob("*.yaml"))
    axes = {"backend": backends, "phase": list(phase_names()), "device": ["cpu", "cuda"]}
    forbidden = [*ACCELERATOR_STACK, "ray", "mlflow"]  # Ray and MLflow load when a run starts, not to plan
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(axes), str(CONF), json.dumps(forbidden)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["variants"] >= len(backends) * 2 and out["exports"] >= 1
    assert out["heavy"] == [], f"the driver imported {out['heavy']}"


def test_registry_modules_import_without_torch():
    """The driver reads every format's, runtime's and phase's facts: none may pull in torch."""
    code = (
        "import sys\n"
        "from tasks.registry import available\n"
        "from tasks.export import format_module\n"
        "from tasks.runtimes import runtime_module\n"
        "from tasks.phases import phase_module, phase_names\n"
        "for n in available('tasks.export'): format_module(n)\n"
        "for n in available('tasks.runtimes'): runtime_module(n)\n"
        "for n in phase_names(): phase_module(n)\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {ACCELERATOR_STACK!r})\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_ray_worker_imports_the_task_entries_without_the_drivers_libraries():
    """Every Ray worker imports orchestrator.run.entries (its tasks' functions) and, at its first
    task, tasks.jobs: neither may load what only the driver needs (each worker would pay for it)."""
    code = (
        "import sys\n"
        "import orchestrator.run.entries, tasks.jobs, tasks.worker.transfer\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {('mlflow', 'hydra', 'omegaconf', *ACCELERATOR_STACK)!r})\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]


# -- one home for each phase ---------------------------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _is_phase_name(node: ast.AST) -> bool:
    """`phase.name`, `spec.phase.name`, `self.phase.name`, `v.phase.name` ..."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "phase") or (
        isinstance(owner, ast.Attribute) and owner.attr == "phase"
    )


def phase_branches(code: str, label: str) -> list[str]:
    """Code (not comments or docstrings) that names a phase or compares a phase's name."""
    tree = ast.parse(code, label)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in phase_names() and id(node) not in docs:
            found.append(f"{label}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Compare) and any(_is_phase_name(n) for n in (node.left, *node.comparators)):
            found.append(f"{label}:{node.lineno}: compares the phase's name")
        elif isinstance(node, ast.Match) and _is_phase_name(node.subject):
            found.append(f"{label}:{node.lineno}: matches on the phase's name")
    return found


# Where a phase may be named outside its module: none.
ALLOWED: set[str] = set()


def test_nothing_outside_a_phase_module_branches_on_its_name():
    files = [*sources("orchestrator", "tasks", "hydra_plugins", exclude="tasks/phases"), ROOT / "sweep.py"]
    found = [hit for p in files for hit in phase_branches(p.read_text(), str(p.relative_to(ROOT)))]
    assert [h for h in found if h.split(":")[0] not in ALLOWED] == []


def test_the_phase_branch_finder_sees_a_branch():
    """The check above would fail if such code were written (and ignores prose)."""
    code = (
        '"""decode and prefill in a docstring are fine."""\n'
        "# so is 'prefill' in a comment\n"
        "def f(spec, phase):\n"
        '    """A docstring naming \'decode\'."""\n'
        '    if spec.phase.name == "decode":\n'
        "        return 1\n"
        "    match phase.name:\n"
        "        case _:\n"
        '            return {"prefill": 2}\n'
    )
    assert sorted(phase_branches(code, "probe.py")) == [
        "probe.py:5: 'decode'",
        "probe.py:5: compares the phase's name",
        "probe.py:7: matches on the phase's name",
        "probe.py:9: 'prefill'",
    ]
