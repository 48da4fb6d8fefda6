"""tasks/worker/forks.py: the node's fork server. Each job runs in a child forked for it alone;
a crash, a timeout or a client that goes away are data, and the server ends with the
process that keeps it. The servers here preload only the stdlib: what is checked is the
mechanism (a sweep's own servers import torch & co.: tests/test_end_to_end.py)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.jobs import fork_servers
from tasks.model.families import FAMILIES
from tasks.specs import BenchResult
from tasks.worker import forks
from tasks.worker.forks import EXPORT_SERVER, bench_server
from tasks.worker.fresh import in_fresh_process

HERE = Path(__file__).resolve().parent


def whoami(_):
    import gc

    return {
        "pid": os.getpid(),
        "gc": (gc.isenabled(), gc.get_freeze_count()),
        "parent": os.getppid(),
        "forked": forks.FORKED,
        "modules": "json" in sys.modules,
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def import_and_tell(names):
    import importlib

    for name in names:
        importlib.import_module(name)
    return forks.imported_since_fork()


def exit_with(code):
    os._exit(code)


def kill_myself(sig):
    os.kill(os.getpid(), sig)


def write_pid_and_sleep(path):
    Path(path).write_text(str(os.getpid()))
    time.sleep(600)


def gone(pid: int, within: float = 30.0) -> bool:
    """Wait for `pid` to end (an event, with a generous deadline for a loaded machine)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a child of ours ends as a zombie until reaped
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A fork server in tmp_path kept by a `sleep` process (its watched pid): (folder, keeper)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    keeper = subprocess.Popen(["sleep", "600"])
    folder = tmp_path / "forks"
    forks.start(folder, keeper.pid, ("json",))
    yield folder, keeper
    keeper.kill()
    keeper.wait()


def server_pid(folder: Path) -> int:
    """The server of `folder`: started by this process (its children carry the same command line)."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", f"tasks.worker.forks {folder} "], capture_output=True, text=True)
    pids = out.stdout.split()
    assert len(pids) == 1, pids
    return int(pids[0])


def test_each_job_runs_in_a_child_forked_for_it_alone(server):
    folder, _ = server
    first = forks.run(forks.connect(folder), whoami, None, 60)
    second = forks.run(forks.connect(folder), whoami, None, 60)
    assert first[0] == second[0] == "result"
    a, b = first[1], second[1]
    assert a["pid"] != b["pid"] and os.getpid() not in (a["pid"], b["pid"])
    assert a["parent"] == b["parent"] == server_pid(folder)  # the server forked both
    assert a["forked"] and b["forked"] and a["modules"]  # what the server preloaded is there
    # the server's imports are frozen (tasks/worker/heap.py): the child's collector, on, walks only its own objects
    assert a["gc"][0] and a["gc"][1] > 0, a["gc"]
    assert not forks.FORKED  # this process was not forked by a server


def test_a_child_runs_in_the_environment_of_the_process_that_asked(server, monkeypatch):
    """Ray sets CUDA_VISIBLE_DEVICES (the GPU it granted), OMP_NUM_THREADS, ... per task: the
    child sees the asking task's environment, not the server's."""
    folder, _ = server
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert forks.run(forks.connect(folder), whoami, None, 60)[1]["gpus"] == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert forks.run(forks.connect(folder), whoami, None, 60)[1]["gpus"] is None


def test_a_child_that_dies_is_reported_with_how_it_ended(server):
    folder, _ = server
    assert forks.run(forks.connect(folder), exit_with, 3, 60) == ("died", 3)
    assert forks.run(forks.connect(folder), kill_myself, signal.SIGSEGV, 60) == ("died", -signal.SIGSEGV)


def test_a_child_past_its_timeout_is_killed(server, tmp_path):
    folder, _ = server
    marker = tmp_path / "pid"
    assert forks.run(forks.connect(folder), write_pid_and_sleep, str(marker), 5) == ("timeout", None)
    assert gone(int(marker.read_text()))


def test_a_client_that_goes_away_takes_its_child_with_it(server, tmp_path):
    """A Ray task cancelled or its worker killed: the child it asked for does not live on."""
    folder, _ = server
    marker = tmp_path / "pid"
    conn = forks.connect(folder)
    conn.send((write_pid_and_sleep, str(marker), dict(os.environ)))
    kind, pid = conn.recv()
    assert kind == "pid"
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:  # the child is running
        time.sleep(0.05)
    conn.close()  # hang up
    assert gone(pid)


def test_the_server_ends_with_the_process_that_keeps_it(server):
    folder, keeper = server
    pid = server_pid(folder)
    keeper.kill()
    keeper.wait()
    assert gone(pid)
    assert not (folder / forks.SOCKET).exists()
    with pytest.raises(forks.ForkServerError, match="no fork server listens"):
        forks.connect(folder)


def test_starting_twice_keeps_the_one_server(server):
    folder, keeper = server
    pid = server_pid(folder)
    forks.start(folder, keeper.pid, ("json",))
    assert server_pid(folder) == pid


def test_without_a_server_the_process_is_spawned(tmp_path, monkeypatch):
    """No server in the folder (it did not start, or the node joined later): the job still
    runs in a fresh process, spawned, and a crash there is still data."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    result = in_fresh_process(whoami, None, 120, "benchmark", str(tmp_path / "none"))
    assert result["pid"] != os.getpid() and not result["forked"]


def nap(spec):
    time.sleep(spec.seconds)


def die(spec):
    os.kill(os.getpid(), spec.signal)


def test_a_forked_benchmark_that_dies_fails_its_variant(server):
    """in_fresh_process through a server: a child's death is the variant's failure, as spawned."""
    folder, _ = server
    result = in_fresh_process(die, SimpleNamespace(variant="v", signal=signal.SIGKILL), 60, "benchmark", str(folder))
    assert isinstance(result, BenchResult) and not result.ok and result.variant == "v"
    assert (result.failure.stage, result.failure.error) == ("benchmark", "the benchmark process died: killed by SIGKILL")
    late = in_fresh_process(nap, SimpleNamespace(variant="v", seconds=600), 2, "benchmark", str(folder))
    assert late.failure.error == "timed out after 2s of its own run (cluster.task_timeout_s)"


def test_a_child_names_the_libraries_it_imported_after_its_fork(server):
    """What the server's preload missed, by library: a submodule of one it had (json.decoder)
    or the standard library's (email) is not one; yaml is. A process no server forked: None."""
    folder, _ = server
    kind, late = forks.run(forks.connect(folder), import_and_tell, ("json.decoder", "email.message", "yaml"), 60)
    assert kind == "result" and "yaml" in late and not {"json", "email", "tasks"} & set(late)
    assert late == tuple(sorted(late))
    assert forks.imported_since_fork() is None


def test_each_runtime_has_a_server_of_its_own_importing_what_it_loads():
    """Exports' server: torch, transformers, the formats' exporters, the modelling modules of
    the families it exports only. A benchmark's: its runtime's libraries only, so an ONNX
    Runtime benchmark's memory holds no torch; a runtime that builds models (eager) adds the
    modelling modules of the families it runs."""
    llama, phi3 = FAMILIES["llama"].rotary_module, FAMILIES["phi3"].rotary_module
    servers = fork_servers({("onnx", "llama")}, {("onnxruntime", "llama")})
    assert set(servers) == {EXPORT_SERVER, bench_server("onnxruntime")}
    assert {"torch", "transformers", "torch.onnx", "onnxscript", llama} <= set(servers[EXPORT_SERVER])
    assert phi3 not in servers[EXPORT_SERVER]
    assert not any(m.startswith("executorch") for m in servers[EXPORT_SERVER])
    assert servers[bench_server("onnxruntime")] == ("numpy", "numpy.random", "onnxruntime", "onnx", "tasks.jobs")
    assert servers[EXPORT_SERVER][-1] == "tasks.jobs"  # what a child unpickles its job from
    exports = {("onnx", "llama"), ("executorch", "phi3"), ("none", "llama")}
    benches = {("onnxruntime", "llama"), ("executorch", "phi3"), ("eager", "phi3"), ("compile", "llama")}
    every = fork_servers(exports, benches)
    assert {"executorch.exir", "torch.onnx", llama, phi3} <= set(every[EXPORT_SERVER])
    assert "executorch.runtime" in every[bench_server("executorch")]
    assert {"torch", "transformers", phi3} <= set(every[bench_server("eager")]) and llama not in every[bench_server("eager")]
    assert llama in every[bench_server("compile")] and phi3 not in every[bench_server("compile")]
    assert "torch._dynamo" in every[bench_server("compile")] and "torch._dynamo" not in every[bench_server("eager")]
    assert not any(m.startswith("transformers.models") for m in every[bench_server("onnxruntime")])
    assert all(len(mods) == len(set(mods)) for mods in every.values())


def test_an_onnx_runtime_benchmarks_server_holds_no_torch():
    """Its preload, the job module included, imports neither torch nor transformers: a
    benchmark's memory is the runtime's alone."""
    mods = fork_servers({("onnx", "llama")}, {("onnxruntime", "llama")})[bench_server("onnxruntime")]
    code = f"import importlib, sys; [importlib.import_module(m) for m in {list(mods)!r}]; " + (
        "assert not {'torch', 'transformers'} & set(sys.modules), 'torch or transformers imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_a_server_being_started_makes_clients_wait_for_it(tmp_path, monkeypatch):
    """A benchmark that comes while its runtime's server is still importing waits for it
    rather than spawning: the server's import is held at a gate, and the client waits
    until the gate opens and the server is ready."""
    import threading

    gate = tmp_path / "gate"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PHASESWEEP_TEST_GATE", str(gate))
    keeper = subprocess.Popen(["sleep", "600"])
    try:
        folder = tmp_path / "slow"
        starting = forks.begin(folder, keeper.pid, ("fork_preload_gate",))
        got: list = []
        client = threading.Thread(target=lambda: got.append(forks.connect(folder)))
        client.start()
        client.join(0.5)
        assert client.is_alive() and not got  # the gate is shut: it cannot have connected
        gate.touch()
        starting.wait()
        client.join(60)
        assert got and forks.run(got[0], whoami, None, 60)[1]["forked"]
    finally:
        keeper.kill()
        keeper.wait()


def kill_the_server(spec):
    Path(spec.marker).write_text(str(os.getpid()))
    os.kill(os.getppid(), signal.SIGKILL)  # the server that forked this child
    time.sleep(600)


def test_a_server_that_goes_away_mid_job_fails_the_job_saying_so(server, tmp_path):
    """The server killed while its child runs: the child goes with it (PR_SET_PDEATHSIG) and
    the variant fails naming the server, not a bare end of file."""
    folder, _ = server
    marker = tmp_path / "pid"
    spec = SimpleNamespace(variant="v", marker=str(marker))
    result = in_fresh_process(kill_the_server, spec, 60, "benchmark", str(folder))
    assert isinstance(result, BenchResult) and not result.ok
    assert result.failure.error == "the fork server of the benchmark process ended before its result came"
    assert gone(int(marker.read_text()))


def test_a_preload_that_fails_warns_with_its_name():
    with pytest.warns(UserWarning, match="cannot import no_such_module_of_phasesweep"):
        forks._preload(["json", "no_such_module_of_phasesweep"])


def sys_modules_has(names):
    return {name: name in sys.modules for name in names}


def test_a_server_begun_with_more_to_come_imports_the_rest_before_it_listens(tmp_path, monkeypatch):
    """A warm server (ForkServers.warm) imports its first modules, then waits for the rest its
    starter writes once planned: no client is served before both are in."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    keeper = subprocess.Popen(["sleep", "600"])
    folder = tmp_path / "forks"
    try:
        starting = forks.begin(folder, keeper.pid, ("json",), more=True)
        assert not (folder / forks.SOCKET).exists()  # it waits for the rest
        starting.preload(("csv", "yaml"))
        starting.wait()
        kind, had = forks.run(forks.connect(folder), sys_modules_has, ("json", "csv", "yaml"), 60)
        assert kind == "result" and had == {"json": True, "csv": True, "yaml": True}
    finally:
        keeper.kill()
        keeper.wait()


def test_a_server_begun_with_more_to_come_ends_unused_and_takes_its_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    folder = tmp_path / "forks"
    starting = forks.begin(folder, os.getpid(), ("json",), more=True)
    starting.preload(None)
    assert starting.proc.wait(timeout=60) == 0
    starting.lock.close()
    assert not folder.exists()


def test_the_warm_export_server_is_the_one_the_plan_uses_or_it_ends(tmp_path, monkeypatch):
    """ForkServers.warm begins the export server before the plan; start_local hands it the
    plan's modules (the same process serves the exports), or ends it when no export is to be made."""
    from orchestrator.run import fork_hosts

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(fork_hosts, "EXPORT_BASE", ("json",))
    short = tempfile.mkdtemp(prefix="fk", dir="/tmp")  # its socket's path within AF_UNIX's 107 characters
    monkeypatch.setattr(tempfile, "tempdir", short)
    used = fork_hosts.ForkServers()
    used.warm()
    warm = server_pid(used.base / EXPORT_SERVER)
    try:
        used.start_local({EXPORT_SERVER: ("json", "csv")})
        used.await_ready()
        folder = used.base / EXPORT_SERVER
        assert server_pid(folder) == warm and forks.MORE in Path(f"/proc/{warm}/cmdline").read_text()
        kind, had = forks.run(forks.connect(folder), sys_modules_has, ("json", "csv"), 60)
        assert kind == "result" and had == {"json": True, "csv": True}
    finally:
        used.stop()
    assert gone(warm)

    unused = fork_hosts.ForkServers()
    unused.warm()
    folder = unused.base / EXPORT_SERVER
    warm = server_pid(folder)
    unused.start_local({})  # every export in the cache
    assert gone(warm) and not folder.exists()
    unused.stop()
    shutil.rmtree(short)


def aged(*folders: Path, hours: float = 2.0) -> None:
    """Their modification time set `hours` back: older than forks.STALE_S."""
    past = time.time() - hours * 3600
    for folder in folders:
        os.utime(folder, (past, past))


def killed_at_once(folder: Path, monkeypatch) -> None:
    """A server started in `folder`, then killed with its keeper at once (as SIGKILL to their
    process group would): neither can remove the folder, whose socket and log stay."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    keeper = subprocess.Popen(["sleep", "600"])
    forks.start(folder, keeper.pid, ("json",))
    pid = server_pid(folder)
    for p in (pid, keeper.pid):
        os.kill(p, signal.SIGKILL)
    keeper.wait()
    assert gone(pid) and (folder / forks.SOCKET).exists() and (folder / "server.log").exists()


def test_the_folders_servers_killed_with_their_driver_left_are_removed_and_no_other(server, tmp_path, monkeypatch):
    parent = tmp_path / "p"
    dead, fresh, starting = parent / "d1" / "r", parent / "d2" / "r", parent / "d3" / "r"
    killed_at_once(dead, monkeypatch)
    killed_at_once(fresh, monkeypatch)
    starting.mkdir(parents=True)
    lock = (starting / forks.LOCK).open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # a server being started holds it
    live, _ = server
    serving = server_pid(live)
    shutil.move(live, parent / "d4")  # a live server, its folder moved where the others are
    live = parent / "d4"
    aged(dead, dead.parent, starting, starting.parent, live.parent)

    assert forks.remove_dead(parent) == [dead.parent]
    assert not dead.parent.exists()
    assert fresh.exists() and starting.exists() and live.exists()  # changed within STALE_S; starting; listening
    kind, pid = forks.run(forks.connect(live), whoami, None, 60)
    assert kind == "result" and pid["parent"] == serving  # the probe left it serving
    lock.close()
    assert forks.remove_dead(parent) == [starting.parent]  # its start ended without a server
    aged(fresh.parent)
    assert forks.remove_dead(parent) == [fresh.parent]
    assert forks.remove_dead(tmp_path / "missing") == []


def test_a_sweeps_stop_removes_what_servers_killed_with_their_driver_left(tmp_path, monkeypatch):
    from orchestrator.run import fork_hosts

    short = tempfile.mkdtemp(prefix="fk", dir="/tmp")  # the sockets' paths within AF_UNIX's 107 characters
    monkeypatch.setattr(tempfile, "tempdir", short)
    dead = fork_hosts.fork_base("driver-1", "0" * 32) / EXPORT_SERVER
    killed_at_once(dead, monkeypatch)
    aged(dead, dead.parent)
    fork_hosts.ForkServers().stop()
    assert not dead.parent.exists()
    shutil.rmtree(short)
