"""orchestrator/run/ray_session.py without starting Ray: a failed local start leaves none of its
processes and is made again; the temp folder fits Ray's socket paths; and the two private Ray
names phasesweep still uses exist in the installed Ray (these fail loudly on an upgrade)."""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.common import ray_env
from orchestrator.run import ray_folders, ray_session
from tests.conftest import ROOT

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _fake_start(folder: str) -> list[subprocess.Popen]:
    """What a start leaves in its folder: a process naming it (Ray's raylet, GCS...) and one with a
    Ray title holding a log there (its agents); returned once the title is set."""
    logs = Path(folder) / "session_2026-01-01_00-00-00_000000_1" / "logs"
    logs.mkdir(parents=True)
    named = subprocess.Popen([*SLEEP, f"--log_dir={logs}"])
    with open(logs / "agent.out", "w") as out:
        agent = subprocess.Popen(["bash", "-c", "exec -a ray::FakeAgent sleep 600"], stdout=out)
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{agent.pid}/cmdline").read_bytes().startswith(b"ray::") and time.monotonic() < deadline:
        time.sleep(0.01)
    return [named, agent]


@pytest.fixture
def folders(monkeypatch, tmp_path):
    """Each start's temp folder made under tmp_path."""
    import tempfile

    monkeypatch.setattr(ray_folders, "new_folder", lambda: tempfile.mkdtemp(dir=tmp_path))


def _ended(procs: list[subprocess.Popen], timeout: float = 30) -> bool:
    try:
        return all(p.wait(timeout) is not None for p in procs)
    except subprocess.TimeoutExpired:
        return False


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()


def test_a_failed_local_start_is_ended_and_made_again(caplog, folders):
    starts: list[tuple[str, list[subprocess.Popen]]] = []

    def init(folder):
        starts.append((folder, _fake_start(folder)))
        if len(starts) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")
        return SimpleNamespace(folder=folder)

    try:
        with caplog.at_level("WARNING", logger="phasesweep"):
            context = ray_session.start_local(init)
        assert len(starts) == 2 and context.folder == starts[1][0] != starts[0][0]
        assert _ended(starts[0][1]), "a failed start's processes outlived it"
        assert all(p.poll() is None for p in starts[1][1]), "the start that succeeded lost a process"
        assert "the local Ray did not start (Exception: The current node timed out" in caplog.text
        assert "ended the 2 process(es) it had started, starting it again (2 of 3)" in caplog.text
    finally:
        for _, procs in starts:
            _end(procs)


def test_a_local_start_fails_as_its_last_attempt_failed_and_an_interrupt_is_not_retried(folders):
    starts: list[list[subprocess.Popen]] = []

    def refused(folder):
        starts.append(_fake_start(folder))
        raise ConnectionError(f"attempt {len(starts)}")

    try:
        with pytest.raises(ConnectionError, match="attempt 2"):
            ray_session.start_local(refused, attempts=2)
        assert len(starts) == 2 and all(_ended(procs) for procs in starts)

        def interrupted(folder):
            starts.append(_fake_start(folder))
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            ray_session.start_local(interrupted)
        assert len(starts) == 3
        assert _ended(starts[2]), "an interrupted start's processes (the raylet's agents) outlived it"
    finally:
        for procs in starts:
            _end(procs)


def test_a_local_rays_temp_folder_fits_its_socket_paths(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(deep))  # a TMPDIR too long for AF_UNIX paths
    folder = ray_folders.new_folder()
    try:
        assert folder.startswith("/tmp/") and os.path.isdir(folder)
        assert len(folder) + ray_env.RAY_SOCKET_TAIL <= ray_env.SOCKET_PATH_MAX
    finally:
        shutil.rmtree(folder)


def test_ray_imported_before_the_environment_still_has_the_switches_phasesweep_sets():
    """Private: ray_constants.ENABLE_RAY_CLUSTER and ray._raylet.Config.initialize, set when ray
    was imported before LOCAL_ENV (a notebook's; tests/test_end_to_end.py runs that case)."""
    constants, config = ray_session.imported_ray_switches()
    assert isinstance(constants.ENABLE_RAY_CLUSTER, bool) and callable(config.initialize)


def test_ray_loopback_replaces_the_resolver_ray_start_calls(monkeypatch):
    """Private: ray._private.services.resolve_ip_for_localhost, which scripts/ray_loopback.py
    replaces; on any Ray but the pinned one the script says so in one line."""
    spec = importlib.util.spec_from_file_location("ray_loopback", ROOT / "scripts" / "ray_loopback.py")
    loopback = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loopback)
    services = loopback.resolver()
    from ray.scripts import scripts

    assert "services.resolve_ip_for_localhost(node_ip_address)" in inspect.getsource(scripts.start.callback)
    assert "resolve_ip_for_localhost(host)" in inspect.getsource(services.canonicalize_bootstrap_address)
    monkeypatch.setattr(loopback, "pinned_ray", lambda: "0.0.1")
    with pytest.raises(SystemExit, match=r"^scripts/ray_loopback.py: needs Ray 0.0.1 \(pyproject.toml\)"):
        loopback.resolver()


def test_a_shared_ray_head_that_fails_to_start_is_started_again(tmp_path, monkeypatch):
    """scripts/concurrency.py's SharedRay, with a stand-in for `ray start` whose first start
    fails as Ray's does when its raylet misses the 30 s: started again, then ended whole."""
    spec = importlib.util.spec_from_file_location("concurrency", ROOT / "scripts" / "concurrency.py")
    concurrency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(concurrency)
    fake = tmp_path / "ray"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ ! -e {tmp_path}/failed ]; then touch {tmp_path}/failed; echo "The current node timed out"; exit 1; fi\n'
        'echo "Ray runtime started."; exec sleep 600\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(concurrency.SharedRay, "ray", fake)
    head = concurrency.SharedRay(tmp_path, timeout_s=30)
    try:
        assert head.log.read_text().count("The current node timed out") == 1 and head.proc.poll() is None
    finally:
        left = head.close()
    assert left == [] and head.proc.returncode is not None


def test_a_ray_started_outside_ray_init_gets_a_token_on_a_machine_that_never_ran_ray(tmp_path, monkeypatch):
    """`ray start --head` and a test's ray.cluster_utils head abort without ~/.ray/auth_token
    (ray.init makes its own); ensure_auth_token makes one once and keeps it."""
    from orchestrator.common.ray_env import ensure_auth_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    ensure_auth_token()
    token = (tmp_path / ".ray" / "auth_token").read_text()
    assert len(token.strip()) >= 32
    ensure_auth_token()
    assert (tmp_path / ".ray" / "auth_token").read_text() == token


def test_sigterm_inside_ray_init_leaves_as_the_drivers_terminated(monkeypatch):
    """ray.init installs its own SIGTERM handler while it runs, which calls sys.exit(SIGTERM): the
    driver sees its own Terminated (exit 143, its one line), not a bare exit status 15."""
    from orchestrator.common.signals import Terminated
    from orchestrator.plan.config import ClusterCfg
    from tests.conftest import capacity

    def init_meets_sigterm(init, attempts=ray_session.LOCAL_START_ATTEMPTS):
        raise SystemExit(signal.SIGTERM)

    monkeypatch.setattr(ray_session, "start_local", init_meets_sigterm)
    with pytest.raises(Terminated):
        ray_session.start(ClusterCfg(), capacity())


def _fake_ray(calls: list[str]) -> SimpleNamespace:
    return SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: calls.append("ray.shutdown"))


@pytest.mark.parametrize("raylet_gone", [False, True])
def test_a_dead_raylets_ray_is_ended_by_its_watchdog_without_ray_shutdown(monkeypatch, raylet_gone):
    """Once the local raylet has died, Ray's core worker ends the driver at its next call: the
    shutdown makes none, takes ray.shutdown off the exit handlers, and the watchdog ends the
    rest. A live raylet's Ray is shut down as always."""
    import atexit

    calls: list[str] = []
    ray = _fake_ray(calls)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(atexit, "unregister", lambda fn: calls.append("unregister " + ("ray.shutdown" if fn is ray.shutdown else "?")))
    monkeypatch.setattr(ray_folders, "stopped", lambda: [])
    watchdog = SimpleNamespace(
        raylet_gone=lambda: raylet_gone, end_autoscaler=lambda: calls.append("end_autoscaler"), close=lambda: calls.append("close")
    )
    ray_session.shutdown(watchdog)
    if raylet_gone:
        assert calls == ["unregister ray.shutdown", "close"]
    else:
        assert calls == ["end_autoscaler", "ray.shutdown", "close"]
