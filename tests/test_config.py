"""Composition of every option of every config group, and clear errors for bad values."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import open_dict

from orchestrator.plan.config import ConfigError, validate
from tasks.export import format_module
from tasks.registry import available
from tasks.runtimes import runtime_module
from tests.conftest import CONF, ROOT, backend_yaml

GROUPS = ["model", "phase", "backend", "device", "bench", "tracking", "cluster"]


@pytest.fixture
def hydra_compose():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *overrides: compose("sweep", overrides=list(overrides))
    GlobalHydra.instance().clear()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_validates(hydra_compose, group, option):
    required = {("phase", "captured"): ["phase.app=examples.generate_app:run"]}  # null in its yaml: the user names it
    cfg = hydra_compose(f"{group}={option}", *required.get((group, option), []))
    point = validate(cfg)
    assert getattr(point, group) is not None
    if group in ("model", "phase", "backend", "device"):
        assert getattr(point, group).name == option


def test_every_model_size_is_valid(hydra_compose):
    for model in options("model"):
        cfg = hydra_compose(f"model={model}")
        for size in cfg.model.sizes:
            with open_dict(cfg):
                cfg.model.size = size
            assert validate(cfg).model.size == size


def test_launcher_is_ours(hydra_compose):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("sweep", return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("PhaseSweepRayLauncher")


@pytest.mark.parametrize(
    "override,expected",
    [
        ("model.kv_cache=paged", "model.kv_cache='paged' is not allowed; choose one of: static, dynamic"),
        ("model.attention=flash", "model.attention='flash' is not allowed; choose one of: auto, sdpa, math, custom_sdpa"),
        ("model.size=70b", "model.size='70b' is not allowed; choose one of: tiny, smollm2-135m, smollm2-360m, 1b, 3b"),
        ("model.dtype=int3", "model.dtype='int3' is not allowed; choose one of: float32, float16, bfloat16"),
        ("phase.batch=0", "phase.batch=0 must be >= 1"),
        ("phase.batch=two", "phase.batch='two'"),
        ("bench.threads=0", "bench.threads=0 must be >= 1 (or null)"),
    ],
)
def test_bad_value_names_key_value_and_choices(hydra_compose, override, expected):
    cfg = hydra_compose(override)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert expected in str(err.value)


def test_unknown_key_lists_allowed_keys(hydra_compose):
    cfg = hydra_compose("+phase.contxt_len=5")
    with pytest.raises(ConfigError, match=r"phase.contxt_len is not a known key; allowed keys: name, batch"):
        validate(cfg)


def test_unknown_group_option_lists_available(hydra_compose):
    with pytest.raises(ConfigCompositionException) as err:
        hydra_compose("backend=tensorrt")
    assert "backend" in str(err.value) and "onnxruntime" in str(err.value.__cause__ or err.value)


def test_bad_override_on_command_line_fails_before_any_work(tmp_path):
    """The driver rejects the value, names it, and starts neither Ray nor MLflow."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), "-m", "model=llama,phi3", "model.kv_cache=paged"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "model.kv_cache='paged' is not allowed; choose one of: static, dynamic" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.export_cache=/proc/phasesweep", "cluster.export_cache='/proc/phasesweep' is not a writable folder"),
        ("tracking.experiment=" + "x" * 300, "(300 characters): give a name of 1 to 256 characters"),
    ],
)
def test_a_folder_or_name_the_store_cannot_take_fails_before_any_work(sweep_in_tmp, nothing_starts, tmp_path, override, message):
    # in this process (the command line's own exit path: the test above): SystemExit with the
    # line is what `python sweep.py` prints without a traceback
    with pytest.raises(SystemExit) as exit_:
        sweep_in_tmp("-m", "phase=prefill,decode", override)
    assert isinstance(exit_.value.code, str) and message in exit_.value.code, exit_.value.code
    assert not (tmp_path / "mlflow.db").exists()


def test_help_lists_every_group_as_hydras_own_help_does():
    """`--help` alone is answered by orchestrator/help.py; with an override, by Hydra itself."""
    ours, hydras = (
        subprocess.run([sys.executable, "sweep.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        for argv in (["--help"], ["--help", "hydra.verbose=false"])
    )
    assert ours.returncode == hydras.returncode == 0, ours.stderr + hydras.stderr
    for group in GROUPS:
        assert f"{group}:" in ours.stdout
    assert ours.stdout == hydras.stdout


def test_fast_help_leaves_to_hydra_what_it_does_not_fill(tmp_path):
    from orchestrator.help import fast_help

    (tmp_path / "app.yaml").write_text("x: 1\nhydra:\n  help:\n    template: '$APP_CONFIG_GROUPS|$CONFIG'\n")
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "pg.yaml").write_text("port: 5432\n")
    assert fast_help(["--help"], tmp_path, "app", "app") == "db: pg\n|x: 1\n"
    assert fast_help(["--help", "x=2"], tmp_path, "app", "app") is None  # overrides: Hydra's
    (tmp_path / "app.yaml").write_text("hydra:\n  help:\n    template: '$FLAGS_HELP'\n")
    assert fast_help(["-h"], tmp_path, "app", "app") is None  # Hydra's own flags


# -- typed backend options: each module's Options is the schema ---------------------------

RUNTIMES = ", ".join(available("tasks.runtimes"))  # every runtime module in this checkout, as the error lists them


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["backend=compile", "+backend.options.cold_cahce=false"],
            "backend.options.cold_cahce is not a known key; allowed keys: mode, dynamic, cold_cache",
        ),
        (
            ["backend=compile", "backend.options.mode=fastest"],
            "backend.options.mode='fastest' is not allowed; choose one of: None, default, reduce-overhead, "
            "max-autotune, max-autotune-no-cudagraphs",
        ),
        (["backend=compile", "backend.options.dynamic=maybe"], "backend.options.dynamic='maybe': "),
        (
            ["backend=executorch", "backend.export_options.delegate=vulkan"],
            "backend.export_options.delegate='vulkan' is not allowed; choose one of: xnnpack, xnnpack_linear, none",
        ),
        (["backend.export_options.opset=7"], "backend.export_options.opset=7 must be >= 18"),
        (["backend.export_options.opset=latest"], "backend.export_options.opset='latest': "),
        (
            ["backend.options.graph_optimization_level=max"],
            "backend.options.graph_optimization_level='max' is not allowed; choose one of: disable, basic, extended, all",
        ),
        (
            ["backend=eager", "+backend.options.threads=4"],
            "backend.options.threads is not a known key; allowed keys: (none)",
        ),
        (
            ["backend.runtime=nope"],
            f"backend.runtime='nope' is not allowed; choose one of: {RUNTIMES}",
        ),
        (
            ["backend.export_format=tflite"],
            "backend.export_format='tflite' is not allowed; choose one of: executorch, gguf, none, onnx",
        ),
        (
            ["backend.runtime=json"],
            f"backend.runtime='json' is not allowed; choose one of: {RUNTIMES} "
            "(or an importable module path): module json defines no RUNTIME (an instance of tasks.contract.Runtime)",
        ),
    ],
)
def test_typed_backend_options_are_checked(hydra_compose, overrides, expected):
    cfg = hydra_compose(*overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert expected in str(err.value)


def test_backend_options_are_completed_with_their_defaults(hydra_compose):
    point = validate(hydra_compose("backend=compile", "backend.options.mode=max-autotune"))
    assert point.backend.options == {"mode": "max-autotune", "dynamic": None, "cold_cache": True}
    assert point.backend.runtime == "compile" and point.backend.export_options == {}
    point = validate(hydra_compose("backend.export_options.opset=20"))
    assert point.backend.export_options == {"opset": 20, "optimize": True, "exporter": "torch", "ort_fusions": True}


def test_runtime_defaults_to_the_backend_name(hydra_compose):
    cfg = hydra_compose("backend=eager")
    with open_dict(cfg):
        del cfg.backend["runtime"]
    assert validate(cfg).backend.runtime == "eager"


# a yaml's deliberate departures from its module's defaults, each with its reason in the yaml
DEVIATIONS = {("openvino", "export_options"): {"ort_fusions": False}}  # OpenVINO refuses GroupQueryAttention without a past


@pytest.mark.parametrize("option", options("backend"))
def test_backend_yaml_lists_exactly_its_modules_options_with_their_defaults(option):
    """One home for defaults: each yaml's `options` and `export_options` are the fields of
    its runtime's and its format's Options, with the same default values; a yaml built on
    another (its defaults list) may set some to other values, which it names itself."""
    own = yaml.safe_load((CONF / "backend" / f"{option}.yaml").read_text())
    y = backend_yaml(option)
    for section, module in (
        ("options", runtime_module(y.get("runtime") or y["name"])),
        ("export_options", format_module(y["export_format"])),
    ):
        def default(f):  # a value, or a factory of one (a list)
            return f.default if f.default is not dataclasses.MISSING else f.default_factory()

        fields = dataclasses.fields(module.Options)
        assert all((f.default, f.default_factory) != (dataclasses.MISSING,) * 2 for f in fields), module.__name__
        schema = {f.name: default(f) for f in fields}
        if "defaults" in own:
            schema.update(own.get(section) or {})
        schema.update(DEVIATIONS.get((option, section), {}))
        assert (y.get(section) or {}) == schema, f"conf/backend/{option}.yaml `{section}` vs {module.__name__}.Options"
        assert list(y.get(section) or {}) == list(schema)  # in the same order, as they read side by side


# -- the phase against the model, before any run -------------------------------------------


def test_a_phase_longer_than_the_model_is_refused_by_validate(hydra_compose):
    with pytest.raises(ConfigError, match="phase.prompt_len=100000 exceeds the model's max_position_embeddings=4096"):
        validate(hydra_compose("phase.prompt_len=100000"))
    with pytest.raises(ConfigError, match="max_position_embeddings=4096"):
        validate(hydra_compose("phase=decode", "phase.context_len=5000"))


def test_parity_steps_beyond_the_headroom_name_cache_len(hydra_compose):
    with pytest.raises(ConfigError, match=r"phase.cache_len=136 \(the default: context_len \+ 8\) cannot hold"):
        validate(hydra_compose("phase=decode", "phase.parity_steps=20"))
    point = validate(hydra_compose("phase=decode", "phase.parity_steps=20", "phase.cache_len=160"))
    assert point.phase.cache_len == 160


def test_checkpoint_without_config_json_names_model_checkpoint(hydra_compose, tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(hydra_compose(f"model.checkpoint={tmp_path}"))
    text = str(err.value)
    assert text.startswith(f"model.checkpoint='{tmp_path}'") and "config.json" in text


def write_checkpoint(folder, config: dict) -> None:
    """A llama checkpoint with the standard library: config.json and zero weights of the right shapes."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    shapes = {"model.embed_tokens.weight": [config["vocab_size"], h]}
    for i in range(layers):
        shapes |= {f"model.layers.{i}.self_attn.{p}_proj.weight": [h, h] for p in "qkvo"}
    header, offset = {}, 0
    for name, shape in shapes.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * shape[0] * shape[1]]}
        offset = header[name]["data_offsets"][1]
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + bytes(offset))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **config}))


def test_checkpoint_config_is_checked_against_the_phase(hydra_compose, tmp_path):
    """A checkpoint's own config.json sizes the phase check (and missing keys fall back to
    the family's transformers defaults)."""
    arch = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 512}
    write_checkpoint(tmp_path, {**arch, "max_position_embeddings": 256})
    point = validate(hydra_compose(f"model.checkpoint={tmp_path}", "phase.prompt_len=256"))
    assert point.arch["max_position_embeddings"] == 256
    with pytest.raises(ConfigError, match="phase.prompt_len=257 exceeds the model's max_position_embeddings=256"):
        validate(hydra_compose(f"model.checkpoint={tmp_path}", "phase.prompt_len=257"))
    write_checkpoint(tmp_path, arch)  # LlamaConfig's default: 2048 positions
    with pytest.raises(ConfigError, match="max_position_embeddings=2048"):
        validate(hydra_compose(f"model.checkpoint={tmp_path}", "phase.prompt_len=4000"))


@pytest.mark.parametrize(
    ("overrides", "attention"),
    [
        (["model=llama"], "sdpa"),
        (["model=llama", "model.kv_cache=update_cache"], "custom_sdpa"),
        (["model=gemma2", "model.attention=auto"], "math"),  # soft-capped scores: math is the one that caps
    ],
)
def test_attention_auto_is_the_one_the_cache_and_the_model_need(hydra_compose, overrides, attention):
    assert validate(hydra_compose(*overrides)).model.attention == attention
