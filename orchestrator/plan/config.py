"""Config schemas, validated in the driver before any work starts.

Each config group is made into its dataclass schema (types, unknown keys), once per distinct
content, without OmegaConf where that gives the same (orchestrator.plan.convert). Then come
the checks: allowed values, the phase against the model's dimensions, and each backend's
options against the typed Options of its export format and runtime modules. Every error
names the key, the value and what is allowed. Identical errors of many jobs are reported once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from omegaconf import DictConfig

from orchestrator.plan.checks import EXPERIMENT_NAME_MAX, baseline_last, check_bench, fraction, safe_name, typed
from orchestrator.plan.convert import merged, plain_object
from orchestrator.plan.env import EnvCfg
from orchestrator.plan.model_group import Model, ModelCfg, architecture
from tasks.export import format_module
from tasks.phases import phase_module
from tasks.runtimes import profiled_runtimes, runtime_module
from tasks.specs import DEVICES, BenchOptions, ConfigError, PhaseSpec, at_least, choice

__all__ = ["ConfigError", "SweepPoint", "validate", "validate_all"]


@dataclass
class BackendCfg:
    name: str
    export_format: str  # a module of tasks/export/ or an importable module path
    devices: list[str]
    runtime: str | None = None  # a module of tasks/runtimes/ or an importable module path; None: name
    export_options: dict[str, Any] = field(default_factory=dict)  # typed by the format's Options
    options: dict[str, Any] = field(default_factory=dict)  # typed by the runtime's Options

    def check(self) -> None:
        safe_name("backend.name", self.name)
        for d in self.devices:
            choice("backend.devices[]", d, DEVICES)
        self.runtime = self.runtime or self.name
        fmt, rt = format_module(self.export_format), runtime_module(self.runtime)
        self.format_part, self.runtime_part = fmt, rt  # handed on (no fields, so no params): none looks them up again
        self.export_options = typed("backend.export_options", fmt.Options, self.export_options)
        self.options = typed("backend.options", rt.Options, self.options)


@dataclass
class DeviceCfg:
    name: str
    resources: dict[str, Any] = field(default_factory=dict)
    peak_bandwidth_gbs: float | None = None

    def check(self) -> None:
        choice("device.name", self.name, DEVICES)


@dataclass
class TrackingCfg:
    uri: str | None = None
    artifact_root: str | None = None
    experiment: str = "phasesweep"
    max_model_mb: float | None = None  # larger exported models are not copied into MLflow
    resume: bool = True  # reuse variants that already ended ok with the same bench key; false: measure again
    outage_s: float = 600.0  # a tracking server away this long ends the sweep (its writes kept in a journal)
    journal_dir: str | None = None  # where writes to a server are journaled; null: .phasesweep_journal
    baseline: str | None = None  # hold the sweep against `last:N` sweeps or a named sweep run (docs/regressions.md)
    min_effect: float = 0.05  # the baseline's verdict: the smallest relative change that alerts

    def check(self) -> None:
        at_least("tracking.max_model_mb", self.max_model_mb, 0, optional=True)
        at_least("tracking.outage_s", self.outage_s, 0)
        self.baseline_last()  # its format checked before any work
        fraction("tracking.min_effect", self.min_effect)
        if not self.experiment or len(self.experiment) > EXPERIMENT_NAME_MAX:
            raise ConfigError(
                f"tracking.experiment={self.experiment!r} ({len(self.experiment or '')} characters): give a name of 1 to "
                f"{EXPERIMENT_NAME_MAX} characters (what a tracking server's database holds)"
            )

    def baseline_last(self) -> int | None:
        """N of `tracking.baseline=last:N`; None for a named sweep run or no baseline."""
        return baseline_last("tracking.baseline", self.baseline)


@dataclass
class ClusterCfg:
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = False
    export_cache: str = ".phasesweep_cache"
    task_timeout_s: float = 3600.0
    max_retries: int = 1
    fork_server: bool = True

    def check(self) -> None:
        at_least("cluster.num_cpus", self.num_cpus, 1, optional=True)
        at_least("cluster.task_timeout_s", self.task_timeout_s, 1)
        at_least("cluster.max_retries", self.max_retries, 0)


@dataclass
class SweepPoint:
    """One composed config, validated: what a single grid point asks for. Its phase is
    normalised by the phase's module; `arch` is the model's transformers config, `dims` and
    `parameters` what the plan reads of it, made once per distinct model group."""

    model: ModelCfg
    phase: PhaseSpec
    backend: BackendCfg
    device: DeviceCfg
    bench: BenchOptions
    tracking: TrackingCfg
    cluster: ClusterCfg
    env: EnvCfg = field(default_factory=EnvCfg)
    arch: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)  # the model's dimensions (tasks.model.families.model_dims)
    parameters: int = 0  # a checkpoint's, counted from its tensors; else estimated from arch
    # its phase's module (tasks/phases/), resolved once by the validator as the backend's parts are
    phase_part: ModuleType | None = field(default=None, repr=False, compare=False)


_SCHEMAS = {
    "model": ModelCfg,
    "phase": PhaseSpec,
    "backend": BackendCfg,
    "device": DeviceCfg,
    "bench": BenchOptions,
    "tracking": TrackingCfg,
    "cluster": ClusterCfg,
    "env": EnvCfg,
}
_OPTIONAL = frozenset({"env"})  # a config may lack it (a run's config.yaml from before it existed): its defaults


def _section(sections: Sections, idx: int, key: str) -> Any:
    """Job idx's group `key` as its schema's dataclass: made from its plain content where that
    is exactly what OmegaConf makes, else by OmegaConf, whose errors name the key and value."""
    if key in _OPTIONAL and key not in sections.top_keys(idx):
        return _SCHEMAS[key]()
    plain = sections.plain_section(idx, key)
    obj = plain_object(_SCHEMAS[key], plain) if plain is not None else None
    return obj if obj is not None else merged(sections.read_section(idx, key), key, _SCHEMAS[key])


# the checks of one group's content alone, in the order validate() makes them
_CHECKS: dict[str, Callable[[Any], None]] = {
    "model": ModelCfg.check,
    "backend": BackendCfg.check,
    "device": DeviceCfg.check,
    "bench": check_bench,
    "cluster": ClusterCfg.check,
    "tracking": TrackingCfg.check,
    "env": EnvCfg.check,
}


class Sections(Protocol):
    """A sweep's jobs read by group (orchestrator.plan.compose.JobConfigs): `section_keys(i, keys)`
    gives, for each top-level key, a key equal for two jobs whose group has equal content;
    `read_section(i, key)` a config whose `key` is job i's group; `plain_section(i, key)` that
    group as plain dicts and lists when it holds no interpolation, else None."""

    def top_keys(self, idx: int) -> tuple[str, ...]: ...

    def section_keys(self, idx: int, keys: Sequence[str]) -> tuple[Hashable, ...]: ...

    def read_section(self, idx: int, key: str) -> DictConfig: ...

    def plain_section(self, idx: int, key: str) -> dict[str, Any] | None: ...


class _Each:
    """Sections of plain configs: nothing shared, every job read as it is."""

    def __init__(self, configs: Sequence[DictConfig]):
        self.configs = configs

    def top_keys(self, idx: int) -> tuple[str, ...]:
        return tuple(str(k) for k in self.configs[idx])

    def section_keys(self, idx: int, keys: Sequence[str]) -> tuple[Hashable, ...]:
        return tuple((idx, key) for key in keys)

    def read_section(self, idx: int, key: str) -> DictConfig:
        return self.configs[idx]

    def plain_section(self, idx: int, key: str) -> dict[str, Any] | None:
        return None  # one config, or a test's list: read by OmegaConf


class _Validator:
    """validate(), each step made once per distinct input: a group's conversion and checks
    once per distinct content, the model's architecture once per model group, the phase's
    checks once per (phase, model) pair. Outcomes (objects or ConfigErrors) are kept, so a
    job raises exactly what validate() of its whole config raises, in the same order."""

    def __init__(self, sections: Sections, overrides: Sequence[Sequence[str]] | None = None):
        self.sections, self.overrides = sections, overrides
        self.converted: dict[Hashable, Any] = {}  # section key -> dataclass | ConfigError
        self.checked: dict[Hashable, ConfigError | None] = {}
        self.models: dict[Hashable, Model | ConfigError] = {}  # model key -> its architecture
        self.phases: dict[tuple[Hashable, Hashable], tuple[PhaseSpec, ModuleType] | ConfigError] = {}

    @staticmethod
    def _outcome(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ConfigError as e:
            return e

    def point(self, idx: int) -> SweepPoint:
        top = self.sections.top_keys(idx)
        unknown = [k for k in top if k not in _SCHEMAS and k != "hydra"]
        if unknown:
            raise ConfigError(f"unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(_SCHEMAS)}")
        keys = dict(zip(_SCHEMAS, self.sections.section_keys(idx, tuple(_SCHEMAS)), strict=True))
        chosen, named = _model_choice(self.overrides[idx] if self.overrides is not None else ())
        keys["model"] = (keys["model"], chosen, named)  # a checkpoint's family and name depend on them
        parts = {}
        for key in _SCHEMAS:
            if keys[key] not in self.converted:
                self.converted[keys[key]] = self._outcome(lambda key=key: _section(self.sections, idx, key))
            parts[key] = self.converted[keys[key]]
            if isinstance(parts[key], ConfigError):
                raise parts[key]
        for key, check in _CHECKS.items():
            if keys[key] not in self.checked:
                self.checked[keys[key]] = self._outcome(lambda check=check, key=key: check(parts[key]))
            if self.checked[keys[key]] is not None:
                raise self.checked[keys[key]]
        point = SweepPoint(**parts)
        if keys["model"] not in self.models:  # a checkpoint's every problem, before the phase's
            self.models[keys["model"]] = self._outcome(lambda: architecture(point.model, chosen, named))
        if isinstance(self.models[keys["model"]], ConfigError):
            raise self.models[keys["model"]]
        if point.bench.profile and point.backend.runtime_part.PROFILER is None:
            raise ConfigError(
                f"bench.profile=true: backend.runtime={point.backend.runtime!r} has no profiler (no PROFILER in "
                f"its RUNTIME); runtimes that profile: {', '.join(profiled_runtimes())}"
            )
        pair = (keys["phase"], keys["model"])
        if pair not in self.phases:
            self.phases[pair] = self._outcome(lambda: self._phase(point, keys["model"]))
        if isinstance(self.phases[pair], ConfigError):
            raise self.phases[pair]
        point.phase, point.phase_part = self.phases[pair]
        point.arch, point.dims, point.parameters = self.models[keys["model"]]
        return point

    def _phase(self, point: SweepPoint, key: Hashable) -> tuple[PhaseSpec, ModuleType]:
        phase = phase_module(point.phase.name)
        spec = phase.normalize(point.phase, point.model.kv_cache)
        phase.check(spec)  # what the config alone decides ...
        phase.check(spec, self.models[key][1])  # ... and against the model's dimensions
        return spec, phase


def _model_choice(overrides: Sequence[str]) -> tuple[str | None, bool]:
    """(the command line's `model=` or `model.family=` override, or None; whether it set model.name)."""
    chosen, named = None, False
    for line in overrides:
        key, _, value = line.partition("=")
        key = key.lstrip("+~")
        chosen = f"{key}={value}" if key in ("model", "model.family") else chosen
        named = named or key == "model.name"
    return chosen, named


def validate(cfg: DictConfig, overrides: Sequence[str] | None = None) -> SweepPoint:
    """The composed config as checked dataclasses, or a ConfigError. `overrides`: the command
    line's (by default, those Hydra recorded in the config, if any)."""
    if overrides is None and "hydra" in cfg:
        overrides = list(cfg.hydra.overrides.task)
    return _Validator(_Each([cfg]), [overrides or ()]).point(0)


def validate_all(configs: Sequence[DictConfig], overrides: list[list[str]]) -> list[SweepPoint]:
    """Every job validated; all errors at once, each distinct message once with the jobs
    it affects (a 1,000-job grid with one bad value prints one line, not 1,000). Configs
    that can be read by group (orchestrator.plan.compose.JobConfigs) are validated once per
    distinct group content: the points share those groups' objects (never changed once
    validated; a checkpoint sets its model's family and name while it is)."""
    validator = _Validator(configs if hasattr(configs, "section_keys") else _Each(configs), overrides)  # type: ignore[arg-type]
    points: list[SweepPoint] = []
    errors: dict[str, list[int]] = {}
    for idx in range(len(configs)):
        try:
            points.append(validator.point(idx))
        except ConfigError as e:
            errors.setdefault(str(e), []).append(idx)
    if errors:
        lines = [msg + jobs_text(jobs, overrides, len(configs)) for msg, jobs in errors.items()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))
    for group in ("tracking", "cluster"):  # one sweep is one MLflow parent run on one Ray
        values = {repr(v) for v in {id(getattr(p, group)): getattr(p, group) for p in points}.values()}
        if len(values) > 1:
            raise ConfigError(
                f"{group}.* must be the same for every job of a sweep; got {len(values)} different "
                f"settings (sweep {group} options in separate invocations)"
            )
    return points


def jobs_text(jobs: list[int], overrides: list[list[str]], total: int, shown: int = 3) -> str:
    """The jobs a config error affects, as validate_all prints them after it."""
    if total == 1:
        return ""
    listed = ", ".join(f"#{j} ({' '.join(overrides[j])})" for j in jobs[:shown])
    more = f" and {len(jobs) - shown} more" if len(jobs) > shown else ""
    return f"  [{len(jobs)} of {total} jobs: {listed}{more}]"
