"""The launcher's fast composition (orchestrator/plan/compose.py) against Hydra's full compose.

Every job of a varied grid (group choices x value overrides of every type, and overrides
that must take the full-compose path) is composed both ways and compared whole, hydra node
included, unresolved and resolved. Nothing is left out of the comparison: the launcher sets
hydra.job.num/id on both (as it always did), hydra.overrides.task and
hydra.job.override_dirname are recomputed per job exactly as Hydra computes them, and the
one field Hydra leaves unset until a job runs, hydra.runtime.output_dir (which
hydra.job_logging's file name interpolates), is set to the same path on both before
resolving. Validation and planning of the two are then compared too: the same points, the
same plan, the same error messages.
"""

from __future__ import annotations

import itertools

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict

from orchestrator.plan.compose import JobConfigs
from orchestrator.plan.config import ConfigError, validate_all
from orchestrator.plan.planner import make_plan
from tests.conftest import capacity

# value overrides of every type, applied on top of each combination
VALUES = [
    ["phase.batch=1", "phase.batch=3"],  # int
    ["bench.target_ci=0.05"],  # float
    ["tracking.resume=false"],  # bool
    ["bench.threads=null"],  # null
    ["model.kv_cache=static", "model.kv_cache=dynamic"],  # string
    ["backend.devices=[cpu,cuda]"],  # list
    ["model.sizes.tiny={hidden_size: 32, vocab_size: 256}"],  # dict, merged into the node
    ["tracking.experiment='an experiment'"],  # quoted string
]
GROUPS = [["model=llama", "model=phi3"], ["phase=prefill", "phase=decode"]]
GROUPS += [["backend=eager", "backend=executorch"], ["device=cpu", "device=cuda"]]
FAST_GRID = [[*g, *v] for g in itertools.product(*GROUPS) for v in itertools.product(*VALUES)]

# jobs the fast path must hand to Hydra whole, and jobs it handles that a grid rarely has
FULL_JOBS = [
    ["model=phi3", "phase=decode", "+phase.note=hello"],  # + adds a key
    ["model=phi3", "++bench.repeats=2"],  # ++ adds or overrides
    ["model=llama", "phase=decode", "~model.attention"],  # ~ deletes
    ["model=phi3", "+model@extra=llama"],  # a group at another package
    ["model=llama", "hydra.job.name=renamed"],  # a hydra key
    ["model=phi3", "bench={warmup_iters: 3}"],  # a dict given to a group
]
ODD_JOBS = [
    ["phase.batch=2"],  # no group override at all
    ["phase=decode", "model=phi3", "backend=onnxruntime", "device=cpu"],  # the groups in another order
    ["model=llama", "phase=prefill", "backend=eager", "device=cuda", "phase.seed=${model.seed}"],  # interpolation
    ["model=phi3", "phase=decode", "backend=executorch", "device=cpu", "model.seed=7", "model.seed=9"],  # twice
]


def full_compose(loader, master, job: list[str], num: int):
    """What Hydra's own launchers compose for job #num."""
    cfg = loader.load_sweep_config(master, job)
    with open_dict(cfg):
        cfg.hydra.job.id = cfg.hydra.job.num = num
    return cfg


def comparable(cfg, tmp_path) -> tuple[dict, dict]:
    with open_dict(cfg):  # unset until Hydra runs a job; hydra.job_logging interpolates it
        cfg.hydra.runtime.output_dir = str(tmp_path)
    return OmegaConf.to_container(cfg, resolve=False), OmegaConf.to_container(cfg, resolve=True)


def test_fast_and_full_compose_give_identical_configs(hydra_loader, tmp_path):
    loader, master = hydra_loader
    jobs = FAST_GRID + FULL_JOBS + ODD_JOBS
    configs = JobConfigs(loader, master, jobs, first_job=5)
    # the work: the grid's 16 combinations of group choices cost 5 composes (the reference
    # and one star per other option: phi3, decode, executorch, cuda), the other 11 are
    # swapped together; ODD_JOBS add 2 combinations (no group; another order), composed;
    # FULL_JOBS are composed whole
    full = list(range(len(FAST_GRID), len(FAST_GRID) + len(FULL_JOBS)))
    assert configs.full_jobs == full
    assert configs.combinations == 16 + 2 and configs.composed == 5 + 2 + len(FULL_JOBS)

    # (a full compose takes 0.1-1 s here) the first job of half the combinations, from 0 to 4
    # groups swapped, every fast job of the last one, and every other job
    firsts = sorted({tuple(j[:4]): i for i, j in reversed(list(enumerate(FAST_GRID)))}.values())
    one_combo = [i for i, j in enumerate(FAST_GRID) if j[:4] == FAST_GRID[-1][:4]]
    checked = sorted({*firsts[::2], firsts[-1], *one_combo, *range(len(FAST_GRID), len(jobs))})
    for i in checked:
        fast, slow = configs[i], full_compose(loader, master, jobs[i], 5 + i)
        assert comparable(fast, tmp_path) == comparable(slow, tmp_path), jobs[i]
    # ${now:...} resolves as in the master config (Hydra copies its resolver cache)
    assert configs[0].hydra.sweep.dir == master.hydra.sweep.dir
    # each call gives a fresh config: a caller may change it
    assert configs[0] is not configs[0] and configs[-1].hydra.job.num == 5 + len(jobs) - 1


def test_a_key_is_taken_through_dicts_only_never_through_an_interpolation():
    from orchestrator.plan.combination import exists

    cfg = OmegaConf.create({"a": {"b": 1, "link": "${x}", "todo": "???", "seq": [{"c": 1}]}, "x": {"y": 2}})
    assert exists(cfg, "a.b") and exists(cfg, "a.link") and exists(cfg, "x.y")
    assert not any(exists(cfg, k) for k in ("a.link.y", "a.todo", "a.seq.0", "a.b.c", "a..b", "z"))


def test_a_key_the_combination_lacks_fails_as_hydra_fails(hydra_loader):
    loader, master = hydra_loader
    job = ["backend=eager", "backend.options.mode=default"]  # eager has no options
    with pytest.raises(ConfigCompositionException) as hydra_err:
        loader.load_sweep_config(master, job)
    with pytest.raises(ConfigCompositionException) as ours:
        JobConfigs(loader, master, [["backend=onnxruntime", "backend.options.graph_optimization_level=all"], job])
    assert str(ours.value) == str(hydra_err.value)


def test_validation_and_plan_are_the_same_both_ways(hydra_loader):
    loader, master = hydra_loader
    # (a cross-group interpolation fails validation either way: test_errors_are_the_same_both_ways)
    same_tracking = ["tracking.resume=false", "tracking.experiment='an experiment'"]  # one per sweep
    odd = [[*j, *same_tracking] for j in ODD_JOBS if not any("${" in o for o in j)]
    jobs = [j for j in FAST_GRID if "phase.batch=3" in j and "model.kv_cache=dynamic" in j][1::3] + odd
    overrides = [list(j) for j in jobs]
    fast = JobConfigs(loader, master, jobs)
    slow = [full_compose(loader, master, j, i) for i, j in enumerate(jobs)]
    points = validate_all(fast, overrides)
    assert points == validate_all(slow, overrides)
    a, b = (
        make_plan(points, fast, overrides, capacity()),
        make_plan(validate_all(slow, overrides), slow, overrides, capacity()),
    )
    assert [(pv.name, pv.jobs, pv.bench, pv.request, pv.export_key) for pv in a.variants] == [
        (pv.name, pv.jobs, pv.bench, pv.request, pv.export_key) for pv in b.variants
    ]
    assert [(s.key, s.reason) for s in a.skipped] == [(s.key, s.reason) for s in b.skipped]
    assert list(a.exports) == list(b.exports)
    # a variant's config is its first job's, composed when asked for
    pv = a.variants[-1]
    assert OmegaConf.to_container(pv.config) == OmegaConf.to_container(slow[pv.jobs[0]])


# one bad value per kind of override (a string, an int, a string for an int, a list, a + key
# that takes the full compose, an interpolation) in the quick loop; the rest in the full suite
@pytest.mark.parametrize(
    "bad",
    [
        "model.kv_cache=paged",
        pytest.param("model.dtype=int3", marks=pytest.mark.slow),
        "phase.batch=0",
        "phase.batch=two",
        pytest.param("bench.threads=0", marks=pytest.mark.slow),
        "+phase.contxt_len=5",
        pytest.param("model.name='a/b'", marks=pytest.mark.slow),
        "backend.devices=[tpu]",
        pytest.param("phase.context_len=100000", marks=pytest.mark.slow),
        "phase.seed=${model.seed}",  # another group, unreachable from the group alone
    ],
)
def test_errors_are_the_same_both_ways(hydra_loader, bad):
    """Key, value and what is allowed, each distinct message once with the jobs it affects."""
    loader, master = hydra_loader
    jobs = [["model=llama", "phase=decode", bad], ["model=phi3", "phase=decode", bad], ["model=phi3", "phase=prefill"]]
    overrides = [list(j) for j in jobs]
    with pytest.raises(ConfigError) as slow:
        validate_all([full_compose(loader, master, j, i) for i, j in enumerate(jobs)], overrides)
    with pytest.raises(ConfigError) as fast:
        validate_all(JobConfigs(loader, master, jobs), overrides)
    assert str(fast.value) == str(slow.value)
    assert "jobs: #" in str(fast.value)


def test_hydra_is_the_version_whose_parser_and_defaults_list_compose_reads():
    """An upgrade of hydra-core fails here first: check that the override parser and the defaults
    list (docs/architecture.md, private uses) still read as compose.py reads them, then move the pin."""
    from importlib import metadata

    from orchestrator.plan.compose import HYDRA_PINNED
    from tests.conftest import ROOT

    assert f'"hydra-core=={HYDRA_PINNED}"' in (ROOT / "pyproject.toml").read_text()
    assert metadata.version("hydra-core") == HYDRA_PINNED


def test_off_the_pin_every_job_is_composed_by_hydra(hydra_loader, monkeypatch, tmp_path):
    import orchestrator.plan.compose as compose

    loader, master = hydra_loader
    monkeypatch.setattr(compose.metadata, "version", lambda name: "0.0")
    jobs = [["model=phi3", "phase=decode", "backend=executorch", "phase.batch=2"], ["model=llama", "phase.batch=3"]]
    with pytest.warns(UserWarning, match="hydra-core 0.0 is not"):
        configs = JobConfigs(loader, master, jobs)
    assert configs.full_jobs == [0, 1] and configs.combinations == 0
    for i, job in enumerate(jobs):
        assert comparable(configs[i], tmp_path) == comparable(full_compose(loader, master, job, i), tmp_path)
    assert [p.phase.batch for p in validate_all(configs, jobs)] == [2, 3]
