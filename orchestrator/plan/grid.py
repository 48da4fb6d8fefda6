"""Grid control (`hydra.launcher.exclude/include/max_variants`): which points of a composed grid
are planned at all.

A rule maps keys (a group, or a dotted config key as MLflow params name it) to a value or a
list of values; a point matches when every key's value is one of them. `exclude` drops the
points matching any rule; `include`, when given, keeps only those matching one; `max_variants`
keeps each model's first N variants in grid order. Excluded points are listed with their rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from orchestrator.plan.config import BackendCfg, DeviceCfg, SweepPoint
from orchestrator.plan.variant import Variant
from tasks.specs import (
    ATTENTIONS,
    DEVICES,
    DTYPES,
    KV_CACHES,
    QUANTS,
    BenchOptions,
    ConfigError,
    EnvSpec,
    ModelSpec,
    PhaseSpec,
)

# a group key stands for its option's name
GROUP_KEYS = {"model": "model.name", "phase": "phase.name", "backend": "backend.name", "device": "device.name"}
# the fields of each part of a variant (orchestrator.plan.variant.Variant.params), and which hold dicts
SECTIONS: dict[str, tuple[str, ...]] = {
    "model": tuple(f.name for f in fields(ModelSpec)),
    "phase": tuple(f.name for f in fields(PhaseSpec)),
    "backend": tuple(f.name for f in fields(BackendCfg)),
    "device": tuple(f.name for f in fields(DeviceCfg)),
    "bench": tuple(f.name for f in fields(BenchOptions)),
    "env": tuple(f.name for f in fields(EnvSpec)),  # env.pip, a param only where set
}
DICT_FIELDS = {"model.arch", "backend.options", "backend.export_options", "device.resources"}
# keys whose values are a fixed set
CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": DTYPES,
    "model.kv_cache": KV_CACHES,
    "model.attention": ATTENTIONS,
    "model.quant": QUANTS,
    "device.name": DEVICES,
}


@dataclass(frozen=True)
class Rule:
    where: str  # how the plan names it: hydra.launcher.exclude[0]
    text: str  # the rule as given: {backend: executorch, device: cuda}
    match: tuple[tuple[str, tuple[Any, ...]], ...]  # (params key, allowed values)

    def matches(self, params: Mapping[str, Any]) -> bool:
        return all(any(_equal(params.get(key, _ABSENT), v) for v in values) for key, values in self.match)

    def __str__(self) -> str:
        return f"{self.where} {self.text}"


_ABSENT = object()


def _equal(a: Any, b: Any) -> bool:
    """Values as the config holds them: 1 == 1.0, but true is not 1."""
    return a is not _ABSENT and isinstance(a, bool) == isinstance(b, bool) and a == b


@dataclass(frozen=True)
class GridRules:
    include: tuple[Rule, ...] = ()
    exclude: tuple[Rule, ...] = ()
    max_variants: int | None = None
    pair: str | None = None  # the params key whose two values make A/B pairs (orchestrator/plan/pairs.py)

    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude or self.max_variants is not None)

    def why_excluded(self, params: Mapping[str, Any]) -> str | None:
        """The rule that excludes a point with these params, or None."""
        for rule in self.exclude:
            if rule.matches(params):
                return str(rule)
        if self.include and not any(rule.matches(params) for rule in self.include):
            return f"matches no rule of hydra.launcher.include ({len(self.include)})"
        return None

    def cap_text(self, model: str) -> str:
        return (
            f"hydra.launcher.max_variants={self.max_variants}: model {model} has {self.max_variants} variant(s) already"
        )


def _text(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _key(where: str, key: Any) -> str:
    """The params key a rule's key names, or a ConfigError naming the allowed ones."""
    key = str(key)
    if key in GROUP_KEYS:
        return GROUP_KEYS[key]
    section, _, rest = key.partition(".")
    field_, _, deeper = rest.partition(".")
    allowed = ", ".join(GROUP_KEYS)
    if section not in SECTIONS:
        raise ConfigError(
            f"{where}: {key} is not a known key; allowed keys: {allowed}, or a dotted key of "
            f"{', '.join(s + '.*' for s in SECTIONS)} (e.g. phase.context_len)"
        )
    if field_ not in SECTIONS[section] or (deeper and f"{section}.{field_}" not in DICT_FIELDS):
        known = ", ".join(f"{section}.{f}" for f in SECTIONS[section])
        raise ConfigError(f"{where}: {key} is not a known key; allowed keys: {known}")
    return key


def _values(where: str, key: str, params_key: str, value: Any, groups: Mapping[str, Sequence[str]]) -> tuple[Any, ...]:
    values = tuple(value) if isinstance(value, list | tuple) else (value,)
    if not values:
        raise ConfigError(f"{where}: {key}=[] matches nothing; give a value or a list of values")
    group = params_key.split(".")[0] if params_key in GROUP_KEYS.values() else None
    allowed = CHOICES.get(params_key) or (tuple(groups[group]) if group and groups.get(group) else None)
    for v in values:
        if isinstance(v, Mapping | list | tuple):
            raise ConfigError(f"{where}: {key}={_text(v)} is not a value; give a value or a list of values")
        if allowed is not None and v not in allowed:
            raise ConfigError(f"{where}: {key}={v!r} is not allowed; choose one of: {', '.join(allowed)}")
    return values


def _rules(name: str, rules: Any, groups: Mapping[str, Sequence[str]]) -> tuple[Rule, ...]:
    if rules is None:
        return ()
    if not isinstance(rules, list | tuple):
        raise ConfigError(
            f"hydra.launcher.{name}={_text(rules)} is not a list of rules, e.g. [{{backend: executorch, device: cuda}}]"
        )
    out = []
    for i, rule in enumerate(rules):
        where = f"hydra.launcher.{name}[{i}]"
        if not isinstance(rule, Mapping) or not rule:
            raise ConfigError(
                f"{where}={_text(rule)} is not a rule: give a mapping of keys to values, e.g. {{backend: executorch, device: cuda}}"
            )
        match = []
        for key, value in rule.items():
            params_key = _key(where, key)
            match.append((params_key, _values(where, str(key), params_key, value, groups)))
        out.append(Rule(where, _text(rule), tuple(match)))
    return tuple(out)


def grid_rules(
    include: Any = None,
    exclude: Any = None,
    max_variants: Any = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    pair: Any = None,
) -> GridRules:
    """The launcher's grid settings, checked. `groups`: the options of each config group
    (what a group key may name); a group left out accepts any name."""
    groups = groups or {}
    if max_variants is not None and (
        isinstance(max_variants, bool) or not isinstance(max_variants, int) or max_variants < 1
    ):
        raise ConfigError(f"hydra.launcher.max_variants={max_variants!r} must be an integer >= 1 (or null: no cap)")
    if pair is not None and (not isinstance(pair, str) or not pair):
        raise ConfigError(f"hydra.launcher.pair={_text(pair)} must be one key, e.g. model.kv_cache (or null: no pairs)")
    pair = _key("hydra.launcher.pair", pair) if pair is not None else None
    return GridRules(_rules("include", include, groups), _rules("exclude", exclude, groups), max_variants, pair)


# -- the grid sifted: what the planner names and places -----------------------------------------
@dataclass(frozen=True)
class Excluded:
    """Points the grid's rules left out: nothing runs or is recorded."""

    jobs: tuple[int, ...]
    name: str  # its base name
    rule: str  # the rule that excluded it, as the plan prints it

    @property
    def key(self) -> str:
        more = f" +{len(self.jobs) - 1}" if len(self.jobs) > 1 else ""
        return f"{self.name} (job #{self.jobs[0]}{more})"


@dataclass(frozen=True)
class Row:
    """One variant of one job's point, as the planner made it: `v` as the point gives it,
    `resolved` with bench.threads resolved against the cluster, `identity` what tells its work apart."""

    job: int
    point: SweepPoint
    v: Variant
    resolved: Variant
    identity: tuple[str, ...]


@dataclass
class Sifted:
    """The grid's rows sorted: to run (one per distinct work, with the jobs it answers),
    skipped (one per distinct work, with the reason) and excluded by the rules, in job order."""

    kept: list[tuple[Variant, list[int]]] = field(default_factory=list)
    skipped: list[tuple[Row, str]] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)


def sift(rows: Sequence[Row], rules: GridRules, unsupported: Callable[[SweepPoint], str | None]) -> Sifted:
    """The rows sorted by the rules, then by what each backend can run (`unsupported`: why not,
    or None). Equal work is one variant answering all its jobs (a decode-only axis swept over
    prefill); with rules.max_variants, each model's first N in grid order, the rest excluded."""
    out = Sifted()
    unique: dict[tuple[str, ...], tuple[Variant, list[int]]] = {}
    seen: set[tuple[str, ...]] = set()  # the skipped ones' identities
    for row in rows:
        rule = rules.why_excluded(row.resolved.params) if rules.active else None
        if rule:
            out.excluded.append(Excluded((row.job,), row.v.base_name, rule))
        elif reason := unsupported(row.point):
            if row.identity not in seen:
                seen.add(row.identity)
                out.skipped.append((row, reason))
        else:
            unique.setdefault(row.identity, (row.resolved, []))[1].append(row.job)
    out.kept = _capped(list(unique.values()), rules, out.excluded)
    out.excluded.sort(key=lambda e: e.jobs[0])
    return out


def _capped(
    order: list[tuple[Variant, list[int]]], rules: GridRules, excluded: list[Excluded]
) -> list[tuple[Variant, list[int]]]:
    """rules.max_variants: each model's first N variants; the rest added to `excluded`."""
    if rules.max_variants is None:
        return order
    kept, per_model = [], Counter()
    for v, jobs in order:
        per_model[v.model.name] += 1
        if per_model[v.model.name] <= rules.max_variants:
            kept.append((v, jobs))
        else:
            excluded.append(Excluded(tuple(jobs), v.base_name, rules.cap_text(v.model.name)))
    return kept
