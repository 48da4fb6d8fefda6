"""Every job's config of a sweep, composed once per combination of group choices, not once per job.

A job's value overrides (`phase.context_len=512`) are applied on top of its combination's
config as Hydra applies them (OmegaConf.update, merged); a job with any other override
(`+key=`, `~key`, `hydra.*`, `key@pkg`, a key its combination lacks) is composed by Hydra whole.
A combination that differs from the first (the reference) in several groups is the reference
with each such group's node swapped in from a "star" (the reference but for that group),
where Hydra's defaults lists show the swap is exact; otherwise Hydra composes it.
Equal to Hydra's compose of every job: tests/test_compose.py.

Two uses of Hydra beyond its app API, on the pinned hydra-core only (HYDRA_PINNED; listed in
docs/architecture.md): its override parser, and the defaults list that
ConfigLoader.compute_defaults_list returns (typed Any there). Off the pin, every job is
composed by Hydra's public load_sweep_config, as Hydra's own launchers do, with a warning.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from orchestrator.plan.combination import Combination, apply, has_interpolation, set_plain

__all__ = ["JobConfigs"]

HYDRA_PINNED = "1.3.8"  # pyproject.toml's hydra-core: the version whose parser and defaults list are read here
GROUP, VALUE, FULL = "group", "value", "full"
_NONE: tuple[tuple[Override, ...], tuple[str, ...], bool] = ((), (), False)  # no override of a group


def _dirname(overrides: Sequence[Override], exclude_keys: Sequence[str], item_sep: str, kv_sep: str) -> str:
    """hydra.job.override_dirname, as Hydra's compose writes it."""
    lines = sorted(o.input_line for o in overrides if o.key_or_group not in exclude_keys)
    return item_sep.join(lines).replace("=", kv_sep)


def _on_pin() -> bool:
    """hydra-core is HYDRA_PINNED; else a warning, once per sweep."""
    version = metadata.version("hydra-core")
    if version != HYDRA_PINNED:
        warnings.warn(
            f"hydra-core {version} is not {HYDRA_PINNED}, whose override parser and defaults list "
            "orchestrator/plan/compose.py reads: every job of the sweep is composed by Hydra (slower planning)",
            stacklevel=3,
        )
    return version == HYDRA_PINNED


@dataclass(frozen=True)
class _Job:
    lines: tuple[str, ...]  # the job's overrides as Hydra hands them to the launcher
    combo: tuple[str, ...] | None  # its group overrides; None: composed in full
    values: tuple[Override, ...] = ()  # its value overrides, in order
    # its values by top-level key: (them, their texts, whether one holds an interpolation)
    by_group: dict[str, tuple[tuple[Override, ...], tuple[str, ...], bool]] = field(default_factory=dict)


class JobConfigs(Sequence[DictConfig]):
    """The composed configs of a sweep's jobs, as a sequence; see the module's doc."""

    def __init__(self, loader: Any, master: DictConfig, job_overrides: Sequence[Sequence[str]], first_job: int = 0):
        self.loader, self.master, self.first_job = loader, master, first_job
        self.fast = _on_pin()  # False: every job composed by Hydra
        self._parser = OverridesParser.create() if self.fast else None
        self._parsed: dict[str, Override | None] = {}
        self._kind: dict[str, str] = {}
        self._combos: dict[tuple[str, ...], Combination] = {}
        self._full: dict[int, DictConfig] = {}
        self._reference: tuple[tuple[str, ...], list[tuple[str, str]]] | None = None  # its key, (group, option)s
        self._stars: dict[tuple[int, str], Combination | None] = {}  # (position, override) -> its star, if swappable
        self._content_ids: dict[str, int] = {}  # a group's content as text -> a small number
        self._interp: dict[str, tuple[str, bool]] = {}  # override text -> (its top-level key, interpolates)
        self._groups: dict[str, set[str]] = {}  # parent group -> its groups
        self.jobs = [self._job(i, tuple(lines)) for i, lines in enumerate(job_overrides)]

    # -- each job's way -----------------------------------------------------------------------
    def _parse(self, line: str) -> Override | None:
        if line not in self._parsed:
            try:
                (self._parsed[line],) = self._parser.parse_overrides([line])
            except Exception:  # Hydra's full compose reports it in its own words
                self._parsed[line] = None
        return self._parsed[line]

    def _classify(self, line: str) -> str:
        """GROUP: composed with its combination; VALUE: applied on top; FULL: the job is
        composed by Hydra in full. Decided once per distinct override text."""
        if line not in self._kind:
            o = self._parse(line) if self.fast else None
            if o is None or o.is_sweep_override() or o.is_hydra_override() or o.package is not None:
                kind = FULL
            elif self._group_exists(o.key_or_group):
                # Hydra changes the defaults list (any type: +group=, ~group); a dict value is a
                # config override of the group's node, applied in order with the values: in full
                kind = FULL if isinstance(o.value(), dict) else GROUP
            elif o.type != OverrideType.CHANGE or "/" in o.key_or_group:
                kind = FULL
            else:
                kind = VALUE
            self._kind[line] = kind
        return self._kind[line]

    def _job(self, idx: int, lines: tuple[str, ...]) -> _Job:
        kinds = [self._classify(line) for line in lines]
        if FULL not in kinds:
            combo_key = tuple(line for line, k in zip(lines, kinds, strict=True) if k == GROUP)
            combo = self._combo(combo_key)
            values = tuple(self._parsed[line] for line, k in zip(lines, kinds, strict=True) if k == VALUE)
            # a value override of a group's name, or of a key the combination lacks: Hydra's
            # way (its error message, or its group semantics)
            if all(combo.takes(o.key_or_group) for o in values):
                return _Job(lines, combo_key, values, self._by_group(values))
        self._full[idx] = self._compose(list(lines))
        return _Job(lines, None)

    def _by_group(self, values: tuple[Override, ...]) -> dict[str, tuple[tuple[Override, ...], tuple[str, ...], bool]]:
        """A job's value overrides by top-level key: (them, their texts, whether one holds an
        interpolation); each override's key and value read once per distinct text."""
        grouped: dict[str, tuple[tuple[Override, ...], tuple[str, ...], bool]] = {}
        for o in values:
            line = o.input_line
            if line not in self._interp:
                self._interp[line] = (o.key_or_group.split(".", 1)[0], has_interpolation(o.value()))
            top, interp = self._interp[line]
            mine, lines, any_interp = grouped.get(top, _NONE)
            grouped[top] = ((*mine, o), (*lines, line), any_interp or interp)
        return grouped

    def _compose(self, lines: list[str]) -> DictConfig:
        return self.loader.load_sweep_config(self.master, lines)

    # -- combinations ----------------------------------------------------------------------------
    def _combo(self, key: tuple[str, ...]) -> Combination:
        if key not in self._combos:
            self._combos[key] = self._make_combo(key)
        return self._combos[key]

    def _compose_recorded(self, key: tuple[str, ...]) -> Combination:
        """Composed by Hydra, with its defaults list (config_path, package, parent, is_self):
        on the pin only (the module's doc), as compute_defaults_list's result is typed Any."""
        overrides = [*self.master.hydra.overrides.hydra, *key]
        found = self.loader.compute_defaults_list(self.master.hydra.job.config_name, overrides, RunMode.RUN)
        defaults = [(d.config_path, d.package, d.parent, d.is_self) for d in found.defaults]
        return Combination(self._compose(list(key)), defaults)

    def _group_exists(self, key: str) -> bool:
        parent, _, name = key.rpartition("/")
        if parent not in self._groups:
            self._groups[parent] = set(self.loader.list_groups(parent))
        return name in self._groups[parent]

    def _choices(self, key: tuple[str, ...]) -> list[tuple[str, str]] | None:
        """(group, option) of each override of a combination, or None unless each is a
        plain `group=option`."""
        out = []
        for line in key:
            o = self._parsed[line]
            if o.type != OverrideType.CHANGE or o.package is not None or not isinstance(o.value(), str):
                return None
            out.append((o.key_or_group, o.value()))
        return out

    def _make_combo(self, key: tuple[str, ...]) -> Combination:
        choices = self._choices(key)
        if self._reference is None:
            combo = self._compose_recorded(key)
            if choices is not None and combo.defaults is not None:
                self._reference = (key, choices)
            return combo
        ref_key, ref_choices = self._reference
        if choices is None or [g for g, _ in choices] != [g for g, _ in ref_choices]:  # other groups: composed
            return self._compose_recorded(key)
        differ = [i for i, ((_, o), (_, r)) in enumerate(zip(choices, ref_choices, strict=True)) if o != r]
        if len(differ) < 2:  # the reference, or a star: composed
            return self._compose_recorded(key)
        stars = [self._star(i, key[i]) for i in differ]
        if any(star is None for star in stars):
            return self._compose_recorded(key)
        swaps = {choices[i][0]: (choices[i][1], star) for i, star in zip(differ, stars, strict=True)}
        return Combination(None, reference=self._combos[ref_key], swaps=swaps, task=list(key))

    def _star(self, i: int, line: str) -> Combination | None:
        """The combination that differs from the reference in its i-th override alone (`line`
        there), composed by Hydra; None when swapping that group's node in is not exact."""
        if (i, line) not in self._stars:
            ref_key, ref_choices = self._reference
            star = self._combo((*ref_key[:i], line, *ref_key[i + 1 :]))
            swappable = self._swappable(ref_choices[i][0], self._combos[ref_key], star)
            self._stars[i, line] = star if swappable else None
        return self._stars[i, line]

    @staticmethod
    def _swappable(group: str, ref: Combination, star: Combination) -> bool:
        """The star's defaults list is the reference's but for the group's one entry, a leaf
        at the group's own top-level package; its other groups' nodes and its choices but the
        group's are the reference's."""
        if ref.defaults is None or star.defaults is None or len(ref.defaults) != len(star.defaults):
            return False
        changed = [(a, b) for a, b in zip(ref.defaults, star.defaults, strict=True) if a != b]
        if len(changed) != 1 or "." in group or "hydra" not in ref.top or ref.top != star.top:
            return False
        ((a, b),) = changed  # (config_path, package, parent, is_self)
        nested = any(d[2] in (a[0], b[0]) for d in ref.defaults + star.defaults)
        if nested or a[1] != group or b[1] != group or a[2] != b[2] or a[3] or b[3]:
            return False
        ref_choices, star_choices = dict(ref.cfg.hydra.runtime.choices), dict(star.cfg.hydra.runtime.choices)
        ref_choices.pop(group, None), star_choices.pop(group, None)
        return ref_choices == star_choices and all(
            ref.fingerprint(k) == star.fingerprint(k) for k in ref.top if k not in ("hydra", group)
        )

    # -- what it did ------------------------------------------------------------------------------
    @property
    def combinations(self) -> int:
        """Distinct combinations of group overrides (with the stars made only to swap from)."""
        return len(self._combos)

    @property
    def composed(self) -> int:
        """How many configs Hydra composed: once per combination not made by swapping, once
        per job composed in full."""
        return sum(1 for c in self._combos.values() if not c.swaps) + len(self._full)

    @property
    def full_jobs(self) -> list[int]:
        return sorted(self._full)

    # -- Sequence[DictConfig] ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, idx: int) -> DictConfig:  # type: ignore[override]
        if not isinstance(idx, int):
            raise TypeError("JobConfigs is indexed by one job's number")
        if idx < 0:
            idx += len(self.jobs)
        job = self.jobs[idx]
        if job.combo is None:
            cfg = self._full[idx]
        else:
            cfg = copy.deepcopy(self._combos[job.combo].cfg)
            apply(job.values, cfg)
            self._hydra_fields(cfg, job)
        with open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = self.first_job + idx
        return cfg

    def __iter__(self) -> Iterator[DictConfig]:
        return (self[i] for i in range(len(self.jobs)))

    def _hydra_fields(self, cfg: DictConfig, job: _Job) -> None:
        """What Hydra's compose records of the job's own overrides (its combination recorded
        its group overrides only): hydra.overrides.task and hydra.job.override_dirname."""
        if "hydra" not in cfg:
            return
        dirname = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = list(job.lines)
            cfg.hydra.job.override_dirname = _dirname(
                overrides=[self._parsed[line] for line in job.lines],
                kv_sep=dirname.kv_sep,
                item_sep=dirname.item_sep,
                exclude_keys=dirname.exclude_keys,
            )

    # -- by group, for validation (orchestrator.plan.config.validate_all) -----------------------------------
    def top_keys(self, idx: int) -> tuple[str, ...]:
        job = self.jobs[idx]
        return tuple(str(k) for k in self._full[idx]) if job.combo is None else self._combos[job.combo].top

    def section_keys(self, idx: int, keys: Sequence[str]) -> tuple[Hashable, ...]:
        """For each top-level key: equal for two jobs whose node `key` has equal content."""
        job = self.jobs[idx]
        if job.combo is None:
            return tuple(("job", idx, key) for key in keys)
        combo = self._combos[job.combo]
        out = []
        for key in keys:
            text, interpolates = combo.fingerprint(key)
            _, lines, interp = job.by_group.get(key, _NONE)
            if interpolates or interp:
                out.append(("job", idx, key))
            else:
                content = self._content_ids.setdefault(text, len(self._content_ids))
                out.append((key, content, lines))
        return tuple(out)

    def plain_section(self, idx: int, key: str) -> dict[str, Any] | None:
        """Job idx's group `key` as plain content with the job's overrides of it set (what
        read_section's node holds); None where OmegaConf or Hydra must read it: a job
        composed in full, an interpolation, an override that merges."""
        job = self.jobs[idx]
        if job.combo is None:
            return None
        combo = self._combos[job.combo]
        mine, _, interp = job.by_group.get(key, _NONE)
        if key not in combo.top or combo.fingerprint(key)[1] or interp:
            return None
        return set_plain(combo.raw(key), [(o.key_or_group.split(".")[1:], o.value()) for o in mine])

    def read_section(self, idx: int, key: str) -> DictConfig:
        """A config whose node `key` is job idx's: the group alone with the job's overrides of
        it applied as Hydra applies them (when its content holds no interpolation, nothing
        outside it changes its values), else the job's whole config."""
        job = self.jobs[idx]
        if job.combo is None:
            return self._full[idx]
        combo = self._combos[job.combo]
        mine, _, interp = job.by_group.get(key, _NONE)
        if combo.fingerprint(key)[1] or interp:
            return self[idx]
        root = OmegaConf.create({key: copy.deepcopy(combo.node(key))} if key in combo.top else {})
        OmegaConf.set_struct(root, True)
        apply(mine, root)
        return root
