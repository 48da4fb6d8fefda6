"""scripts/submit.sh, with a stand-in for Ray's CLI: Ray is given a snapshot of the project
(what git tracks or would track, so a log written meanwhile cannot change the package
between Ray's two hashes of it) holding a file of the submission's own (so Ray never skips
the upload of a package it is about to delete, Ray issue 46625), gone when the submission
ends, whatever its exit status; the command Ray is given is the README's, with the
cluster's GCS address (PHASESWEEP_CLUSTER_ADDRESS here; tests/test_cluster_node.py asks a
dashboard for it)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.conftest import ROOT

FAKE_RAY = """#!/usr/bin/env bash
# what `ray job submit` would package: the files of the --working-dir it is given
for a in "$@"; do case "$a" in --working-dir=*) wd="${a#--working-dir=}";; esac; done
[ -z "${GROW:-}" ] || echo "written while Ray packages" >>"$GROW"  # a log the project keeps writing
{ echo "argv: $*"; echo "auth: $RAY_AUTH_MODE"; echo "dir: $wd"
  (cd "$wd" && find . -type f | sort | sed 's/^/file: /'); sed 's/^/marker: /' "$wd/.phasesweep_submission"
  [ -z "${GROW:-}" ] || sed 's/^/grown: /' "$wd/$(basename "$GROW")"; } >>"$RAY_LOG"
exit "${RAY_EXIT:-0}"
"""


def submit(
    tmp_path: Path, *args: str, exit_code: int = 0, gcs: str | None = "127.0.0.1:6379", grow: Path | None = None
) -> tuple[int, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ray").write_text(FAKE_RAY)
    (bin_dir / "ray").chmod(0o755)
    log = tmp_path / f"ray-{len(list(tmp_path.glob('ray-*.log')))}.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_LOG": str(log), "RAY_EXIT": str(exit_code)}
    env.pop("PHASESWEEP_CLUSTER_ADDRESS", None)
    env.pop("GROW", None)
    if grow:
        env["GROW"] = str(grow)
    if gcs:
        env["PHASESWEEP_CLUSTER_ADDRESS"] = gcs
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh"), *args], env=env, capture_output=True, text=True)
    return proc.returncode, log.read_text().splitlines() if log.exists() else []


def test_each_submission_packages_a_snapshot_of_its_own_and_leaves_none(tmp_path):
    rc1, first = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama")
    rc2, second = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama")
    assert (rc1, rc2) == (0, 0)
    dirs = [next(line[5:] for line in seen if line.startswith("dir: ")) for seen in (first, second)]
    assert dirs[0] != dirs[1] and not any(Path(d).exists() for d in dirs), "a snapshot was left behind"
    markers = [[line for line in seen if line.startswith("marker: ")] for seen in (first, second)]
    assert all(markers) and markers[0] != markers[1], "two submissions of one folder packaged the same content"
    files = {line[len("file: ./") :] for line in first if line.startswith("file: ")}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert {"sweep.py", "scripts/submit.sh", "conf/sweep.yaml", ".phasesweep_submission"} <= files
    assert {f for f in tracked if (ROOT / f).exists()} <= files  # the project as git sees it
    assert not {f for f in files if f.startswith((".venv/", ".git/", "mlflow.db", "multirun/"))}
    argv = next(line for line in first if line.startswith("argv: "))
    assert argv.startswith(f"argv: job submit --address=http://127.0.0.1:8265 --working-dir={dirs[0]} ")
    assert argv.endswith("-- python sweep.py -m model=llama cluster=ray cluster.address=127.0.0.1:6379")
    assert "auth: token" in first


def test_a_file_written_during_the_submission_does_not_change_its_package(tmp_path):
    """A log the project keeps writing while Ray packages it (Ray hashes the folder twice: a
    change between made the job name a package never uploaded): Ray sees the snapshot's copy."""
    log = ROOT / "submission-test-growing.log"  # untracked, not ignored: packaged
    log.write_text("before\n")
    try:
        rc, seen = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama", grow=log)
        assert log.read_text() == "before\nwritten while Ray packages\n"
    finally:
        log.unlink()
    wd = Path(next(line[5:] for line in seen if line.startswith("dir: ")))
    assert rc == 0 and "file: ./submission-test-growing.log" in seen and wd != ROOT
    assert [line for line in seen if line.startswith("grown: ")] == ["grown: before"]  # what it was at submission


def test_a_failed_submission_keeps_its_status_and_leaves_no_snapshot(tmp_path):
    rc, seen = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama", exit_code=3)
    assert rc == 3
    assert not Path(next(line[5:] for line in seen if line.startswith("dir: "))).exists()


def test_no_address_is_the_usage_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: ")


def test_a_dashboard_that_does_not_answer_stops_the_submission_before_ray(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, seen = submit(tmp_path, url, "-m", "model=llama", gcs=None)
    assert rc == 2 and seen == []  # `ray job submit` never ran
