"""Grid -> valid variants (named, resolved) + skipped ones (with reasons) -> deduplicated
export jobs. The plan is final when made: nothing mutates it afterwards."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from orchestrator.plan.capture import Captures
from orchestrator.plan.config import SweepPoint
from orchestrator.plan.grid import GridRules
from orchestrator.plan.pairs import pair_variants
from orchestrator.plan.placement import (
    Capacity,
    Request,
    bench_request,
    bench_threads,
    export_request,
    memory_warning,
    placement_error,
)
from orchestrator.plan.variant import Variant, quality_spec
from tasks.export import format_module
from tasks.phases import label, naming_keys
from tasks.runtimes import runtime_module
from tasks.specs import BenchSpec, ExportSpec

# how a varying axis reads in a variant name; others read `{leaf}{value}`
SHORT = {
    "phase.context_len": "ctx",
    "phase.prompt_len": "p",
    "phase.batch": "b",
    "phase.cache_len": "cache",
    "model.kv_cache": "kv",
    "model.attention": "",
    "model.size": "",
    "backend.export_options.passes": "passes-",
}
DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def suffix(key: str, value: Any) -> str:
    if key == "phase.app":  # a captured variant beside synthetic ones or another application's
        return "captured-" + str(value).partition(":")[0].rsplit(".", 1)[-1]
    if key == "model.dtype":
        return DTYPE_SHORT.get(value, str(value))
    if key == "model.checkpoint":
        return f"ckpt-{Path(value).name}" if value else "random"
    prefix = SHORT.get(key, key.rsplit(".", 1)[-1])
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if text.startswith("["):  # a list, as params hold it (JSON): its items joined, or "none"
        text = "+".join(str(item) for item in json.loads(text)) or "none"
    return f"{prefix}{text}".replace("/", "-").replace(" ", "")


@dataclass(frozen=True)
class PlannedVariant:
    """One variant, resolved: its benchmark's spec and resources are final when planned."""

    name: str
    variant: Variant  # bench.threads resolved against the cluster
    jobs: tuple[int, ...]  # Hydra job indices this variant answers
    bench: BenchSpec
    request: Request  # the benchmark's Ray options and pool
    unplaceable: str | None = None  # why no node can run it: it fails before any export
    warning: str | None = None
    configs: Sequence[DictConfig] = field(default=(), repr=False, compare=False)  # the sweep's

    @property
    def export_key(self) -> str:
        return self.variant.export_key

    @property
    def config(self) -> DictConfig:
        """Its first job's composed config (made when asked: orchestrator.plan.compose)."""
        return self.configs[self.jobs[0]]


@dataclass(frozen=True)
class ExportJob:
    spec: ExportSpec
    request: Request
    variants: tuple[str, ...]  # names of the variants it serves


@dataclass(frozen=True)
class Skipped:
    job: int
    name: str
    reason: str
    variant: Variant
    configs: Sequence[DictConfig] = field(default=(), repr=False, compare=False)  # the sweep's

    @property
    def key(self) -> str:
        """Unique among a sweep's outcomes: several jobs may skip the same combination."""
        return f"{self.name} (job #{self.job})"

    @property
    def config(self) -> DictConfig:
        return self.configs[self.job]


@dataclass(frozen=True)
class Excluded:
    """Points the grid's rules (orchestrator/plan/grid.py) left out: nothing runs or is recorded."""

    jobs: tuple[int, ...]
    name: str  # its base name
    rule: str  # the rule that excluded it, as the plan prints it

    @property
    def key(self) -> str:
        more = f" +{len(self.jobs) - 1}" if len(self.jobs) > 1 else ""
        return f"{self.name} (job #{self.jobs[0]}{more})"


@dataclass(frozen=True)
class Plan:
    point: SweepPoint  # the first job's settings for the sweep-wide groups (tracking, cluster)
    capacity: Capacity
    variants: tuple[PlannedVariant, ...]
    skipped: tuple[Skipped, ...]
    exports: dict[str, ExportJob]  # export key -> the one job that fills it
    excluded: tuple[Excluded, ...] = ()  # by the grid's rules, in job order
    captures: Captures | None = None  # phase=captured: what each application's capture kept
    pairs: tuple[tuple[str, str], ...] = ()  # hydra.launcher.pair: (baseline, candidate) variant names

    def variant(self, name: str) -> PlannedVariant:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, PlannedVariant]:
        return {pv.name: pv for pv in self.variants}

    def fork_servers(self, to_make: Callable[[ExportSpec], bool] = lambda spec: True) -> dict[str, tuple[str, ...]]:
        """The fork servers each node runs for this plan, and what each imports: an export
        server for the formats of the exports `to_make` says are to be made (not in the cache)."""
        from tasks.jobs import fork_servers

        formats = {job.spec.export_format for job in self.exports.values() if to_make(job.spec)}
        return fork_servers(formats, {pv.bench.runtime for pv in self.variants})


def _swept_keys(overrides: list[list[str]]) -> set[str]:
    """Config keys the user set on the command line (`phase.context_len=128,512` -> phase.context_len)."""
    keys = set()
    for o in {o for job in overrides for o in job}:  # each distinct override once
        key = o.split("=", 1)[0].lstrip("+~")
        if not key.startswith("hydra"):
            keys.add(key)
    return keys


def _name_variants(variants: list[Variant], overrides: list[list[str]]) -> list[str]:
    """`{model}_{phase}_{backend}_{device}` + a suffix for each axis the user swept that
    varies among the variants sharing that base name (e.g. `_ctx2048`). Values that follow
    from another choice (a preset's family, a derived cache size) never add a suffix."""
    # choosing a model/phase/backend/device option is already in the base name; other
    # group choices (bench=quick) make every key of that group eligible
    swept = _swept_keys(overrides) - {"model", "phase", "backend", "device"}
    swept |= naming_keys({v.phase.name for v in variants})  # e.g. the shapes a captured application chose

    @cache
    def eligible(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in swept for i in range(1, len(parts) + 1)) and Variant.naming_axis(key)

    groups: dict[str, list[Variant]] = {}
    for v in variants:
        groups.setdefault(v.base_name, []).append(v)
    suffixes: dict[int, str] = {}  # id(variant) -> its name's suffix
    for members in groups.values():
        keys: set[str] = set()
        for v in members:
            keys.update(v.params)
        varying = [k for k in sorted(filter(eligible, keys)) if len({repr(v.params.get(k)) for v in members}) > 1]
        for v in members:
            suffixes[id(v)] = "".join(f"_{suffix(k, v.params[k])}" for k in varying if v.params.get(k) is not None)
    names = [v.base_name + suffixes[id(v)] for v in variants]
    # suffixes that read alike (checkpoints in folders of one name): their params' digest tells them apart
    counts = Counter(names)
    return [n if counts[n] == 1 else f"{n}-{v.identity()[:6]}" for n, v in zip(names, variants, strict=True)]


def bench_spec(name: str, v: Variant, export_dir: str) -> BenchSpec:
    """What a variant's benchmark task gets, reading its export from `export_dir`."""
    return BenchSpec(
        variant=name,
        runtime=v.backend.runtime,
        device=v.device.name,
        model=v.model,
        phase=v.phase,
        export_dir=export_dir,
        bench=v.bench,
        runtime_options=dict(v.backend.options),
        peak_bandwidth_gbs=v.device.peak_bandwidth_gbs,
    )


def export_spec(v: Variant, out_dir: str) -> ExportSpec:
    """What a variant's export task gets, writing its entry at `out_dir`."""
    return ExportSpec(
        key=v.export_key,
        model=v.model,
        phase=v.phase,
        export_format=v.backend.export_format,
        out_dir=out_dir,
        options=dict(v.backend.export_options),
        quality=quality_spec(v.bench),
    )


def _export_dir(cache: Path, v: Variant) -> str:
    return os.path.join(cache, f"{v.model.name}_{label(v.phase)}_{v.backend.export_format}-{v.export_key[:16]}")


def unsupported(point: SweepPoint) -> str | None:
    """Why this backend cannot run this point at all (a skip, never a failure), or None."""
    b, device, dtype = point.backend, point.device.name, point.model.dtype
    if device not in b.devices:
        return f"backend {b.name} does not run on device={device} (backend.devices: {', '.join(b.devices)})"
    runtime = runtime_module(b.runtime)
    m = point.model
    chosen = {"model.kv_cache": m.kv_cache, "model.attention": m.attention, "model.quant": m.quant}
    for module in (format_module(b.export_format), runtime):  # QUANTS: what it runs, by device; absent: none
        runs = getattr(module, "QUANTS", {}).get(device, ("none",))
        if m.quant not in runs:
            note = getattr(module, "QUANT_NOTE", "")  # why not, maybe by device
            note = (note.get(device, "") if isinstance(note, dict) else note) or f"{module.__name__} runs no quantised model (no QUANTS)"
            return f"backend {b.name} cannot run model.quant={m.quant} on device={device} (runs: {', '.join(runs)}): {note}"
    for module in (format_module(b.export_format), runtime):  # REFUSES: {key: {value: why | {device: why}}}
        for key, refused in getattr(module, "REFUSES", {}).items():
            why = refused.get(chosen.get(key))
            why = why.get(device) if isinstance(why, dict) else why
            if why:
                where = f" on device={device}" if isinstance(refused[chosen[key]], dict) else ""
                return f"backend {b.name} cannot run {key}={chosen[key]}{where}: {why}"
    runs = runtime.DTYPES.get(device, ())
    if dtype not in runs:
        note = getattr(runtime, "DTYPE_NOTE", "")
        return (
            f"backend {b.name} does not run model.dtype={dtype} on device={device} "
            f"(runs: {', '.join(runs) or 'none'}){': ' + note if note else ''}"
        )
    fmt = format_module(b.export_format)  # the format's own limits, e.g. the genai exporter's families
    return fmt.unsupported(b.export_options, point.model, point.phase, device) if hasattr(fmt, "unsupported") else None


class _Modules(dict):
    """name -> module, each looked up once per plan."""

    def __init__(self, find: Any):
        super().__init__()
        self.find = find

    def __missing__(self, name: str) -> Any:
        self[name] = self.find(name)
        return self[name]


def make_plan(
    points: list[SweepPoint],
    configs: Sequence[DictConfig],
    overrides: list[list[str]],
    capacity: Capacity,
    rules: GridRules | None = None,
    captures: Captures | None = None,
) -> Plan:
    """The whole grid, resolved against the cluster's capacity: named variants with their
    benchmark specs and resources, skipped combinations with reasons, deduplicated export
    jobs, and the points the grid's rules excluded. Raises ConfigError for a request no
    node can meet, before any run exists. Linear in the grid: every lookup is a dict built
    once, and what many points share (a model's spec, a phase, a bench setting, an export
    key) is made once."""
    rules = rules or GridRules()
    cluster = points[0].cluster
    memo = Variant.memo()
    valid: list[tuple[int, Variant]] = []
    unnamed: list[tuple[int, Variant, Variant, str]] = []  # skipped: job, variant, resolved, why
    excluded: list[Excluded] = []
    threads_of: dict[tuple[int, str], tuple[Any, Any]] = {}  # (bench options, device) -> (them, resolved)
    reasons: dict[tuple[int, str, int, int], tuple[Any, ...]] = {}  # (backend, device, model, phase) -> why skipped
    for idx, point in enumerate(points):
        base = Variant.from_point(point, tuple(overrides[idx]), memo)
        kept = captures.phases(point) if captures else None
        for v in (base,) if kept is None else [replace(base, phase=phase) for phase in kept]:
            key = (id(v.bench), v.device.name)
            if key not in threads_of:  # bench.threads null: every core of a bench node
                threads_of[key] = (
                    v.bench,
                    replace(v.bench, threads=bench_threads(capacity, v.device.name, v.bench.threads)),
                )
            resolved = memo.seed(replace(v, bench=threads_of[key][1]))
            rule = rules.why_excluded(resolved.params) if rules.active else None
            if rule:
                excluded.append(Excluded((idx,), v.base_name, rule))
                continue
            why = (id(point.backend), point.device.name, id(point.model), id(point.phase))  # all unsupported() reads
            if why not in reasons:
                reasons[why] = (point.backend, point.model, point.phase, unsupported(point))
            reason = reasons[why][-1]
            if reason:
                unnamed.append((idx, v, resolved, reason))
                continue
            valid.append((idx, resolved))

    unique: dict[tuple[str, ...], tuple[Variant, list[int]]] = {}
    for idx, v in valid:  # equal work is one variant, e.g. a decode-only axis swept over prefill
        unique.setdefault(memo.identity(v), (v, []))[1].append(idx)
    order = list(unique.values())
    if rules.max_variants is not None:  # the first N variants of each model, in grid order
        kept, per_model = [], {}
        for v, jobs in order:
            per_model[v.model.name] = per_model.get(v.model.name, 0) + 1
            if per_model[v.model.name] <= rules.max_variants:
                kept.append((v, jobs))
            else:
                excluded.append(Excluded(tuple(jobs), v.base_name, rules.cap_text(v.model.name)))
        order = kept
        excluded.sort(key=lambda e: e.jobs[0])
    seen: set[tuple[str, ...]] = set()  # equal skipped work is one skipped variant, as above
    unnamed = [u for u in unnamed if not (memo.identity(u[2]) in seen or seen.add(memo.identity(u[2])))]
    # skipped points are named with the others: a float32 variant and its skipped bfloat16
    # twin must not share a name (both are recorded)
    names = _name_variants([v for v, _ in order] + [r for _, _, r, _ in unnamed], overrides)
    names, skipped_names = names[: len(order)], names[len(order) :]
    skipped = [
        Skipped(idx, name, reason, v, configs) for name, (idx, v, _, reason) in zip(skipped_names, unnamed, strict=True)
    ]

    cache = Path(cluster.export_cache).expanduser().resolve()
    planned: list[PlannedVariant] = []
    users: dict[str, list[str]] = {}
    runtimes, formats = _Modules(runtime_module), _Modules(format_module)
    for name, (v, jobs) in zip(names, order, strict=True):
        runtime = runtimes[v.backend.runtime]
        fmt = formats[v.backend.export_format]
        request = bench_request(
            capacity,
            v.device.name,
            v.bench.threads,
            v.device.resources,
            v.weight_bytes,
            runtime.MEMORY_FACTOR,
            cluster.max_retries,
        )
        bench = bench_spec(name, v, _export_dir(cache, v))
        peak = max(fmt.MEMORY_FACTOR, runtime.MEMORY_FACTOR)
        planned.append(
            PlannedVariant(
                name,
                v,
                tuple(jobs),
                bench,
                request,
                unplaceable=placement_error(capacity, v.device.name, v.weight_bytes),
                warning=memory_warning(capacity, v.weight_bytes, v.backend.export_format, peak),
                configs=configs,
            )
        )
        users.setdefault(v.export_key, []).append(name)

    exports: dict[str, ExportJob] = {}
    for pv in planned:
        v = pv.variant
        if v.export_key in exports:
            continue
        fmt = formats[v.backend.export_format]
        spec = export_spec(v, pv.bench.export_dir)
        request = export_request(capacity, fmt.RESOURCES, v.weight_bytes, fmt.MEMORY_FACTOR, cluster.max_retries)
        exports[v.export_key] = ExportJob(spec, request, tuple(users[v.export_key]))
    pairs = pair_variants(planned, rules.pair) if rules.pair else ()
    return Plan(points[0], capacity, tuple(planned), tuple(skipped), exports, tuple(excluded), captures, pairs)
