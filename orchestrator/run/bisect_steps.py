"""One bisect step (orchestrator.bisect): a commit of the repository under test judged good,
bad or skipped against the good commit.

The variant is planned once from the sweep's overrides, as a sweep plans it (composed from
conf/, validated, named). Each commit's checkout is put first on the import path of the
processes that export and measure it (never this one), so the runtime or format module the
config names by module path is that commit's. The export is made once per distinct export:
a runtime's commits share the plan's own cache entry (the export key already hashes tasks/
and the libraries), a format module in the repository adds its folders' tree id at the
commit to the entry's name. A `--pip` search's steps are releases of one library instead:
each its variant planned with env.pip pinning it, exported and measured in its environment
(tasks/worker/envs.py), the two sides of a pair each in their own.

- latency: the commit and the good commit timed interleaved (tasks/paired.py, as
  `compare --remeasure` does): bad when the ratio's interval lies wholly above 1 + min_effect,
  good when within or below that band, skipped when still undecided at --max-seconds;
- parity: the commit's benchmark (tasks/jobs.py bench_job): bad when its parity check fails;
- quality: the commit's benchmark: bad when it lost quality against the good commit's, as
  compare defines a loss (orchestrator/read/quality_compare.py);
- a commit whose export, load or run fails is skipped, as `git bisect skip` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from orchestrator.plan.config import validate_all
from orchestrator.plan.planner import make_plan
from orchestrator.plan.work import PlannedVariant, export_spec
from orchestrator.read.quality_compare import quality_cell, quality_change
from orchestrator.run.checkout import Commit, tree_id
from orchestrator.run.scheduler import local_capacity
from tasks.jobs import bench_in_fresh_process, export_in_fresh_process
from tasks.measure.effect import band, side
from tasks.paired import PairOptions, PairSpec, paired_job
from tasks.registry import available
from tasks.specs import ConfigError, EnvSpec, check_pins
from tasks.worker.fresh import importing_from

CONF = Path(__file__).resolve().parents[2] / "conf"
METRICS = ("latency", "parity", "quality")
GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Step:
    commit: Commit | Release
    verdict: str  # good | bad | skip
    detail: str  # what decided it, one line
    ratio: float | None = None  # latency: candidate / good, median of the paired rounds
    ci: tuple[float, float] | None = None
    seconds: float = 0.0
    decided: bool = True  # latency: the interval decided it (else its median did, at --max-seconds)


@dataclass(frozen=True)
class Release:
    """A released version of the library a `--pip` search runs: its variant runs with env.pip
    pinning it. Read where a commit would be (Step.commit, the steps' table and MLflow tags)."""

    pin: str  # NAME==VERSION

    @property
    def sha(self) -> str:
        return self.pin

    @property
    def short(self) -> str:
        return self.pin

    @property
    def subject(self) -> str:
        return ""

    @property
    def env(self) -> EnvSpec:
        return EnvSpec((self.pin,))


def releases(text: str) -> list[Release]:
    """--pip NAME==V1,V2,...: one Release per version, in the order given (the first the good end,
    the last the bad); a ConfigError naming the flag, the value and the form otherwise."""
    name, _, versions = text.partition("==")
    pins = [f"{name.strip()}=={v.strip()}" for v in versions.split(",")]
    form = "give --pip NAME==V1,V2,... with two or more distinct versions, the good one first (e.g. onnxruntime==1.29.0,1.30.0,1.31.1)"
    if len(pins) < 2 or len(set(pins)) < len(pins):
        raise ConfigError(f"--pip={text!r}: {form}")
    for pin in pins:
        try:
            check_pins("--pip", pin)
        except ConfigError:
            raise ConfigError(f"--pip={text!r}: {pin!r} is no exact pin; {form}") from None
    return [Release(pin) for pin in pins]


def jobs_of(overrides: Sequence[str]) -> list[list[str]]:
    """The sweep's jobs, one override list each, as Hydra's basic sweeper expands `a=x,y`."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    choices = []
    for o in parsed:
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices.append([f"{o.get_key_element()}={v}" for v in values])
    return [list(job) for job in itertools.product(*choices)]


def plan_variant(overrides: Sequence[str], name: str | None) -> tuple[PlannedVariant, Any]:
    """The variant to search, planned as a sweep of `overrides` plans it on this machine
    (`name` picks one of several; the only one when None), and the sweep's tracking settings."""
    jobs = jobs_of(overrides)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bisect"):
        configs = [compose("sweep", overrides=job) for job in jobs]
    points = validate_all(configs, jobs)
    plan = make_plan(points, configs, jobs, local_capacity(points[0].cluster.num_cpus))
    names = [pv.name for pv in plan.variants]
    if name is None and len(names) == 1:
        return plan.variants[0], plan.point.tracking
    if name not in names:
        why = {s.name: s.reason for s in plan.skipped}.get(name or "")
        raise ConfigError(
            f"--variant={name!r}: " + (f"the plan skips it: {why}" if why else f"choose one of the sweep's variants: {', '.join(names) or 'none'}")
        )
    return plan.variant(name), plan.point.tracking


@dataclass(frozen=True)
class Target:
    """What a search measures: the planned variant, and what of the repository its processes import."""

    planned: PlannedVariant
    repo: Path
    paths: tuple[str, ...]  # folders of the repository put on the import path (relative to its top)
    format_paths: tuple[str, ...]  # of those, the ones that hold the export format's module: its export's input

    @classmethod
    def of(cls, planned: PlannedVariant, repo: Path, paths: tuple[str, ...], checkout: Path) -> Target:
        fmt = planned.variant.backend.export_format
        builtin = "." not in fmt and fmt in available("tasks.export")
        module = Path(*fmt.split("."))
        holds = tuple(p for p in paths if not builtin and _defines(checkout / p, module))
        return cls(planned, repo, paths, holds)

    def import_paths(self, checkout: Path) -> tuple[str, ...]:
        return tuple(str((checkout / p).resolve()) for p in self.paths)

    def export_dir(self, commit: Commit) -> str:
        """The plan's cache entry, or, when the repository holds the format's module, one per
        distinct tree of the folders that hold it."""
        entry = self.planned.bench.export_dir
        return f"{entry}-{tree_id(self.repo, commit, self.format_paths)}" if self.format_paths else entry


def _defines(folder: Path, module: Path) -> bool:
    return (folder / module).with_suffix(".py").is_file() or (folder / module / "__init__.py").is_file()


def export_for(target: Target, commit: Commit, checkout: Path, timeout_s: float | None) -> tuple[Any, str | None]:
    """(the commit's BenchSpec, None) on its export, made or reused; (None, why) when it fails."""
    return export_planned(target.planned, target.export_dir(commit), target.import_paths(checkout), timeout_s)


def export_planned(planned: PlannedVariant, out: str, paths: Sequence[str], timeout_s: float | None) -> tuple[Any, str | None]:
    """(its BenchSpec reading `out`, None) once the variant's export is made or reused there with
    `paths` first on the exporter's import path (and in its env.pip environment); (None, why) when it fails."""
    with importing_from(paths):
        result = export_in_fresh_process(export_spec(planned.variant, out), timeout_s)
    if not result.ok:
        return None, f"export failed: {result.failure.error.strip().splitlines()[-1] if result.failure.error.strip() else '?'}"
    return replace(planned.bench, export_dir=out), None


Side = tuple[Any, tuple[str, ...]]  # a BenchSpec (with its env.pip) and the folders first on its import path


def latency_step(name: str, good: Side, cand: Side, commit: Commit | Release, options: PairOptions) -> Step:
    """The commit (or release) timed interleaved against the good one: bad when slower by more than
    options.min_effect (the ratio's whole interval above 1 + min_effect), good when the whole
    interval lies below that edge; when --max-seconds end with the interval across it, its
    median ratio decides (the step says so: decided=False)."""
    (good_spec, good_paths), (cand_spec, cand_paths) = good, cand
    spec = PairSpec(name, good_spec, cand_spec, options, paths={"baseline": good_paths, "candidate": cand_paths})
    result = paired_job(spec)
    if not result.ok:
        return Step(commit, SKIP, f"did not run: {result.failure.error.strip().splitlines()[-1]}", seconds=result.seconds)
    low, high = result.ci
    edge = band(options.min_effect)[1]
    where = side(result.ci, *band(options.min_effect))
    decided = where == "above" or high < edge
    slower = where == "above" or (not decided and result.ratio > edge)
    said = "slower" if where == "above" else "not slower" if decided else f"undecided, its median {'above' if slower else 'below'} {edge:.3f}"
    detail = f"ratio {result.ratio:.3f} [{low:.3f}, {high:.3f}] in {len(result.ratios)} rounds: {said}"
    return Step(commit, BAD if slower else GOOD, detail, result.ratio, result.ci, result.seconds, decided)


def parity_step(cand: Side, commit: Commit | Release, timeout_s: float | None) -> Step:
    """The commit's (or release's) benchmark: bad when its outputs fail the parity check against the reference."""
    spec, paths = cand
    with importing_from(paths):
        result = bench_in_fresh_process(spec, timeout_s)
    if result.ok:
        return Step(commit, GOOD, f"parity passed (max abs diff {result.metrics.get('parity_max_abs_diff', float('nan')):.3g})")
    error = result.failure.error.strip().splitlines()
    why = error[-1] if error else "?"
    if result.failure.stage == "parity":
        return Step(commit, BAD, f"parity broken: {why}")
    return Step(commit, SKIP, f"did not run ({result.failure.stage}): {why}")


def quality_step(cand: Side, commit: Commit | Release, timeout_s: float | None, reference: dict[str, float] | None) -> tuple[Step, dict[str, float]]:
    """The commit's (or release's) benchmark with its quality (bench.quality): bad when it lost
    quality against `reference`, the good one's metrics, as compare defines a loss; with no
    reference, the good one's own: good once measured. Its metrics come back with the step."""
    spec, paths = cand
    with importing_from(paths):
        result = bench_in_fresh_process(spec, timeout_s)
    if not result.ok:
        error = result.failure.error.strip().splitlines()
        return Step(commit, SKIP, f"did not run ({result.failure.stage}): {error[-1] if error else '?'}"), {}
    if reference is None:
        ok = "quality_top1" in result.metrics
        detail = f"quality measured: top1 {result.metrics['quality_top1']:.0%}" if ok else "no quality measured (needs bench.quality=true)"
        return Step(commit, GOOD if ok else SKIP, detail), result.metrics
    change = quality_change(reference, result.metrics)
    if change is None:
        return Step(commit, SKIP, "no quality measured"), result.metrics
    return Step(commit, BAD if change["lost"] else GOOD, quality_cell(change, "")), result.metrics
