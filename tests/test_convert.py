"""A group's content made into its schema's dataclass without OmegaConf (orchestrator/plan/convert.py
plain_object) is exactly OmegaConf's, or left to OmegaConf: on every group option in conf/,
on each field given values of every kind, and on the plain content JobConfigs reads for a job
against the node OmegaConf reads. Run against the installed OmegaConf, so an upgrade that
converts otherwise fails here."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from orchestrator.plan.combination import set_plain
from orchestrator.plan.compose import JobConfigs
from orchestrator.plan.config import _SCHEMAS, ConfigError
from orchestrator.plan.convert import merged, plain_object
from tests.conftest import CONF

KINDS = [0, 3, -1, 2.5, 5.0, True, False, "x", "5", "", None, [1], ["cpu", "cuda"], [], {"a": 1}, {}]
KINDS += ["???", "${x}", {"a": "${x}"}, ["???"], {1: 2}, {"max_variants": 2}, {"select": 4}, {"bogus": 1}]


def by_omegaconf(key: str, content) -> str:
    """What validation made of the content before: the dataclass's repr (5 and 5.0 differ), or the error."""
    try:
        return repr(merged(OmegaConf.create({key: content}), key, _SCHEMAS[key]))
    except ConfigError as e:
        return f"ConfigError: {e}"


@pytest.fixture(scope="module")
def options() -> dict[tuple[str, str], dict]:
    """Every option of each validated group, composed (its defaults list applied), unresolved."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return {
            (key, path.stem): OmegaConf.to_container(compose("sweep", [f"{key}={path.stem}"])[key], resolve=False)
            for key in _SCHEMAS
            for path in sorted((CONF / key).glob("*.yaml"))
        }


def test_every_group_option_converts_plainly_as_omegaconf_does(options):
    for (key, option), content in options.items():
        plain = plain_object(_SCHEMAS[key], content)
        assert plain is not None, f"{key}={option} is not plain: every job of it would pay OmegaConf's conversion"
        assert repr(plain) == by_omegaconf(key, content), (key, option)


def test_values_of_every_kind_convert_as_omegaconf_does_or_not_at_all(options):
    seen = {"plain": 0, "left": 0}
    for key, content in {key: c for (key, _), c in options.items()}.items():  # one option per group
        for name, value in itertools.product([*content, "unknown_key", "capture"], KINDS):
            changed = {**content, name: value}
            plain = plain_object(_SCHEMAS[key], changed)
            seen["plain" if plain is not None else "left"] += 1
            if plain is not None:
                assert repr(plain) == by_omegaconf(key, changed), (key, name, value)
    assert seen["plain"] > 100 and seen["left"] > 100, seen  # both ways are exercised


def test_set_plain_sets_what_omegaconf_sets_and_leaves_merges_to_it():
    content = {"a": 1, "d": {"b": [1, 2], "c": None}}
    assert set_plain(content, [(["d", "b"], [3]), (["d", "c"], "x"), (["a"], 2)]) == {"a": 2, "d": {"b": [3], "c": "x"}}
    assert content == {"a": 1, "d": {"b": [1, 2], "c": None}}  # not changed: shared by every job of a combination
    assert set_plain(content, [(["d"], {"b": 1})]) is None  # a dict merges
    assert set_plain(content, [(["d"], 5)]) is None  # onto a dict
    assert set_plain(content, [(["d", "b"], 5)]) is None  # a scalar for a list
    assert set_plain(content, [(["a", "b"], 5)]) is None  # through a scalar


VALUES = [
    ["phase.batch=2", "phase.batch=3.5", "phase.batch=true", "phase.batch=two", "phase.batch=null"],
    ["backend.devices=[cpu]", "backend.devices=[cpu,cuda]", "backend.devices=cpu", "backend.name=${model.name}"],
    ["model.sizes.tiny.hidden_size=32", "model.sizes.tiny={hidden_size: 32}", "model.seed=7", "model.seed='7'"],
    ["bench.target_ci=1", "bench.threads=null", "bench.quality=false"],
]


def test_plain_sections_hold_what_omegaconf_reads(hydra_loader):
    """For every job of a varied grid, the plain content of each group (where given) is
    the node OmegaConf reads for that job, and converts to the same dataclass or error."""
    loader, master = hydra_loader
    jobs = [[g, *v] for g in ("model=llama", "model=phi3") for v in [*itertools.zip_longest(*VALUES), *VALUES]]
    jobs = [[o for o in job if o is not None] for job in jobs]
    configs = JobConfigs(loader, master, jobs)
    given = 0
    for idx, key in itertools.product(range(len(jobs)), _SCHEMAS):
        plain = configs.plain_section(idx, key)
        if plain is not None:
            given += 1
            node = configs.read_section(idx, key)[key]
            assert repr(plain) == repr(OmegaConf.to_container(node, resolve=False)), (jobs[idx], key)
            obj = plain_object(_SCHEMAS[key], plain)
            assert obj is None or repr(obj) == by_omegaconf(key, plain), (jobs[idx], key)
    assert given > len(jobs) * 5, given  # interpolations and merges aside, every group is read plainly


@dataclass
class _Inner:
    n: int = 1
    tags: list[str] = field(default_factory=list)


@dataclass
class _Odd:
    keep: dict[str, int] = field(default_factory=lambda: {"a": 1})  # OmegaConf merges into it
    inner: _Inner = field(default_factory=lambda: _Inner(n=5))  # defaults other than _Inner()'s
    plain: _Inner = field(default_factory=_Inner)
    f: float = 0.0


def test_defaults_omegaconf_merges_into_are_left_to_it():
    def by_omegaconf(data):
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(_Odd), data))

    assert by_omegaconf({"keep": {"b": 2}}).keep == {"a": 1, "b": 2}
    for data in ({"keep": {"b": 2}}, {"inner": {"tags": ["x"]}}):
        assert plain_object(_Odd, data) is None, data
    for data in ({"plain": {"n": 2}}, {"f": 3}, {}):
        assert repr(plain_object(_Odd, data)) == repr(by_omegaconf(data)), data
