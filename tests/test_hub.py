"""A Hugging Face id as model.checkpoint (tasks/model/hub.py), against no real Hub.

huggingface_hub's own client talks to a local stand-in of the Hub on 127.0.0.1
(tests/hub_server.py, HF_ENDPOINT): its downloads fill a Hugging Face cache in the test's
folder (HF_HUB_CACHE), which HF_HUB_OFFLINE=1 then reads alone. huggingface_hub reads those
variables once, when imported: this process's tests set its constants too (`hf_home`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.plan.config import ConfigError
from tasks.model.hub import hub_checkpoint, is_hub_id, local_model
from tests.conftest import ROOT, SHRINK, model_spec, plan_jobs
from tests.hub_server import Hub, Repo, folder_files

TINY, PICKLE, NO_CONFIG, GATED, MISSING = (f"phasesweep-test/{n}" for n in ("Tiny-Llama", "Pickle-Only", "No-Config", "Gated", "Missing"))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The local Hub: a tiny llama (tag v1, and main a commit of other weights), a repository
    of pickle weights only, one without config.json, and a gated one."""
    from tasks.model.models import build_model

    base = tmp_path_factory.mktemp("hub")
    build_model(model_spec("llama")).save_pretrained(base / "v1")
    build_model(model_spec("llama", seed=1)).save_pretrained(base / "main")
    files = folder_files(base / "v1")
    server = Hub().start()
    server.repos = {TINY: Repo(), PICKLE: Repo(), NO_CONFIG: Repo(), GATED: Repo(gated=True)}
    server.v1 = server.repos[TINY].add("v1", files)
    server.main = server.repos[TINY].add("main", folder_files(base / "main"))
    server.repos[PICKLE].add("main", {"config.json": files["config.json"], "pytorch_model.bin": b"\x80\x02" + bytes(64)})
    server.repos[NO_CONFIG].add("main", {"model.safetensors": files["model.safetensors"]})
    server.repos[GATED].add("main", files)
    yield server
    server.shutdown()


@pytest.fixture
def hf_home(hub, tmp_path, monkeypatch):
    """This test's own, empty Hugging Face cache, and huggingface_hub pointed at the local Hub
    (environment for the processes a test starts, constants for this one)."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    settings = {
        "ENDPOINT": hub.endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_HUB_OFFLINE": False,
    }
    for name, value in settings.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return home / "hub"


def go_offline(monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def fill_cache(repo_id: str, revision: str | None = None) -> Path:
    """What `hf download` does: the repository's snapshot in the cache, by huggingface_hub."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision))


def test_the_driver_reads_the_headers_and_offline_the_cache_alone(hub, hf_home, monkeypatch):
    weights = len(hub.repos[TINY].commits[hub.main]["model.safetensors"])
    sent = hub.sent.get("model.safetensors", 0)
    ckpt = hub_checkpoint(TINY, None)
    assert ckpt.revision == hub.main and ckpt.family == "llama" and ckpt.name == "Tiny-Llama"
    snapshot = hf_home / "models--phasesweep-test--Tiny-Llama" / "snapshots" / hub.main
    assert ckpt.root == snapshot and ckpt.shapes["model.embed_tokens.weight"] == [512, 64]
    assert hub.sent["model.safetensors"] - sent < weights and not (snapshot / "model.safetensors").exists()  # its header only
    go_offline(monkeypatch)
    with pytest.raises(ConfigError, match="the Hugging Face cache .* lacks it or some of its files at this revision; HF_HUB_OFFLINE=1 forbids a download"):
        hub_checkpoint(TINY, None)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    fill_cache(TINY)
    go_offline(monkeypatch)
    asked = len(hub.log)
    assert hub_checkpoint(TINY, None) == ckpt  # main, as the cache's refs name it, read from the files
    assert hub_checkpoint(TINY, hub.main) == ckpt
    assert len(hub.log) == asked, hub.log[asked:]  # offline: the Hub is never asked


def test_the_id_names_its_variants_and_its_commit_is_a_param_and_part_of_the_export(hub, hf_home):
    (pv,) = plan_jobs(["phase=decode", f"model.checkpoint={TINY}"]).variants
    assert pv.name == "Tiny-Llama_decode_onnxruntime_cpu"
    assert pv.variant.params["model.checkpoint"] == TINY and pv.variant.params["model.revision"] == hub.main
    (old,) = plan_jobs(["phase=decode", f"model.checkpoint={TINY}", "model.revision=v1"]).variants
    assert old.variant.params["model.revision"] == hub.v1
    assert old.export_key != pv.export_key  # another commit: another export
    (same,) = plan_jobs(["phase=decode", f"model.checkpoint={TINY}", f"model.revision={hub.main}"]).variants
    assert same.export_key == pv.export_key  # main and its commit are one revision
    swept = plan_jobs(["phase=decode", f"model.checkpoint={TINY}", "model.revision=v1"],
                      ["phase=decode", f"model.checkpoint={TINY}", "model.revision=main"]).variants  # fmt: skip
    assert [v.name for v in swept] == [f"Tiny-Llama_decode_onnxruntime_cpu_rev-{c[:7]}" for c in (hub.v1, hub.main)]


def refused(sweep_in_tmp, tmp_path: Path, *overrides: str) -> str:
    """The one line a sweep with these overrides exits with, nothing written but Hydra's folder."""
    with pytest.raises(SystemExit) as exit_:
        sweep_in_tmp("-m", "phase=decode", *overrides)
    message = str(exit_.value.code)
    assert message.startswith("phasesweep: invalid config:") and len(message.splitlines()) == 2, message
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".phasesweep_cache").exists()
    return message.splitlines()[1].strip()


# case -> (the overrides, what the one line says after naming the id)
REFUSED = {
    "missing": ([f"model.checkpoint={MISSING}"], "no Hugging Face repository of that id this token can read"),
    "revision": ([f"model.checkpoint={TINY}", "model.revision=nope"], "the repository has no revision 'nope'"),
    "pickle-only": ([f"model.checkpoint={PICKLE}"], r"only pickle weights \(pytorch_model.bin\), never loaded"),
    "no-config": ([f"model.checkpoint={NO_CONFIG}"], "the repository has no config.json"),
    "gated": ([f"model.checkpoint={GATED}"], "a gated repository: accept its conditions"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_id_is_one_line_naming_it_before_any_work(hub, hf_home, tmp_path, sweep_in_tmp, nothing_starts, case):
    overrides, why = REFUSED[case]
    fetched = hub.downloads("model.safetensors")
    line = refused(sweep_in_tmp, tmp_path, *overrides)
    assert line.startswith(f"model.checkpoint={overrides[0].split('=', 1)[1]!r}"), line
    assert re.search(why, line), line
    assert hub.downloads("model.safetensors") == fetched  # refused from the listing, before any weights


def test_offline_an_id_not_in_the_cache_is_one_line(hub, hf_home, tmp_path, sweep_in_tmp, nothing_starts, monkeypatch):
    go_offline(monkeypatch)
    asked = len(hub.log)
    line = refused(sweep_in_tmp, tmp_path, f"model.checkpoint={TINY}")
    assert line.startswith(f"model.checkpoint='{TINY}': no such local folder, and the Hugging Face cache"), line
    assert "HF_HUB_OFFLINE=1 forbids a download" in line and len(hub.log) == asked


def test_a_revision_without_an_id_is_refused(tmp_path, sweep_in_tmp, nothing_starts):
    line = refused(sweep_in_tmp, tmp_path, "model.revision=main")
    assert line.startswith("model.revision='main' with model.checkpoint=None: a revision chooses a commit of a Hugging Face id"), line


def test_an_existing_local_path_wins_over_an_id(hub, hf_home, tmp_path, monkeypatch):
    local = shutil.copytree(fill_cache(TINY, "v1"), tmp_path / TINY)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id(TINY) and is_hub_id("phasesweep-test/Elsewhere") and not is_hub_id("./a/b") and not is_hub_id("/a/b")
    (pv,) = plan_jobs(["phase=decode", f"model.checkpoint={TINY}"]).variants
    assert pv.variant.model.checkpoint == str(local) and pv.variant.model.revision is None
    with pytest.raises(ConfigError, match="a revision chooses a commit of a Hugging Face id"):
        plan_jobs(["phase=decode", f"model.checkpoint={TINY}", "model.revision=v1"])


def test_a_node_fetches_a_commit_once_for_all_its_tasks(hub, hf_home, monkeypatch):
    """Each task resolves the commit on its own node: two at once on a fresh cache download
    the weights once (the lock per commit), and offline the cache alone serves them."""
    spec = model_spec("llama", checkpoint=TINY, revision=hub.v1)
    fetched = hub.downloads("model.safetensors")
    found: list = []
    tasks = [threading.Thread(target=lambda: found.append(local_model(spec))) for _ in range(2)]
    for t in tasks:
        t.start()
    for t in tasks:
        t.join()
    want = hf_home / "models--phasesweep-test--Tiny-Llama" / "snapshots" / hub.v1
    assert [Path(m.checkpoint) for m in found] == [want, want] and hub.downloads("model.safetensors") == fetched + 1
    go_offline(monkeypatch)
    assert Path(local_model(spec).checkpoint) == want
    assert local_model(model_spec("llama")) == model_spec("llama")  # a preset: nothing to fetch


@pytest.mark.slow
def test_a_sweep_of_a_cached_id_offline_runs_and_records_its_commit(hub, hf_home, tmp_path, mlflow_db, cache_override):
    """`python sweep.py -m model.checkpoint=ORG/NAME phase=prefill,decode` with the id in the
    cache and HF_HUB_OFFLINE=1: no Hub at all (HF_ENDPOINT a closed port)."""
    from mlflow.tracking import MlflowClient

    fill_cache(TINY)  # by huggingface_hub's own download
    env = {**os.environ, "PWD": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    uri = mlflow_db(tmp_path)
    argv = [sys.executable, str(ROOT / "sweep.py"), "-m", f"model.checkpoint={TINY}", "phase=prefill,decode", *SHRINK, cache_override]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("phasesweep")
    kids = {r.info.run_name: r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags}
    assert set(kids) == {"Tiny-Llama_prefill_onnxruntime_cpu", "Tiny-Llama_decode_onnxruntime_cpu"}, set(kids)
    for run in kids.values():
        assert run.data.tags["status"] == "ok", run.data.tags
        assert run.data.params["model.checkpoint"] == TINY and run.data.params["model.revision"] == hub.main
        assert f"revision: {hub.main}" in Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))).read_text()


def test_a_task_that_cannot_fetch_its_commit_fails_to_load_naming_it(hub, hf_home, monkeypatch):
    from orchestrator.run.entries import on_this_node
    from tasks.specs import CaptureOptions, CaptureSpec

    go_offline(monkeypatch)
    spec = CaptureSpec("key", model_spec("llama", checkpoint=TINY, revision=hub.v1), "app:run", CaptureOptions(), 1, "store")
    same, failure = on_this_node(spec)
    assert same is spec and failure.stage == "load"
    assert failure.error.startswith(f"model.checkpoint={TINY!r} at commit {hub.v1}: "), failure.error
