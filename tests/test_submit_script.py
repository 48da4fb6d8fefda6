"""scripts/submit.sh, with a stand-in for Ray's CLI: each submission's working directory holds
a file of its own while `ray job submit` packages it (so Ray never skips the upload of a
package it is about to delete, Ray issue 46625), gone when the submission ends, whatever
its exit status; the command Ray is given is the README's, with the cluster's GCS address
(PHASESWEEP_CLUSTER_ADDRESS here; tests/test_cluster_node.py asks a dashboard for it)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.conftest import ROOT

FAKE_RAY = """#!/usr/bin/env bash
# what `ray job submit` would package: the submission files in its working directory
{ echo "argv: $*"; echo "auth: $RAY_AUTH_MODE"; for f in .phasesweep_submission.*; do echo "file: $f $(cat "$f")"; done; } >>"$RAY_LOG"
exit "${RAY_EXIT:-0}"
"""


def submit(tmp_path: Path, *args: str, exit_code: int = 0, gcs: str | None = "127.0.0.1:6379") -> tuple[int, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ray").write_text(FAKE_RAY)
    (bin_dir / "ray").chmod(0o755)
    log = tmp_path / f"ray-{len(list(tmp_path.glob('ray-*.log')))}.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_LOG": str(log), "RAY_EXIT": str(exit_code)}
    env.pop("PHASESWEEP_CLUSTER_ADDRESS", None)
    if gcs:
        env["PHASESWEEP_CLUSTER_ADDRESS"] = gcs
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh"), *args], env=env, capture_output=True, text=True)
    return proc.returncode, log.read_text().splitlines() if log.exists() else []


def test_each_submission_packages_a_file_of_its_own_and_leaves_none(tmp_path):
    before = set(ROOT.glob(".phasesweep_submission.*"))
    rc1, first = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama")
    rc2, second = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama")
    assert (rc1, rc2) == (0, 0)
    mine = [[line for line in seen if line.startswith("file: ")] for seen in (first, second)]
    assert all(files for files in mine), "ray job submit saw no submission file"
    assert set(mine[0]) != set(mine[1]), "two submissions of one folder packaged the same content"
    assert set(ROOT.glob(".phasesweep_submission.*")) == before, "a submission file was left behind"
    argv = next(line for line in first if line.startswith("argv: "))
    assert argv.startswith("argv: job submit --address=http://127.0.0.1:8265 --working-dir=. ")
    assert argv.endswith("-- python sweep.py -m model=llama cluster=ray cluster.address=127.0.0.1:6379")
    assert "auth: token" in first


def test_a_failed_submission_keeps_its_status_and_leaves_no_file(tmp_path):
    before = set(ROOT.glob(".phasesweep_submission.*"))
    rc, _ = submit(tmp_path, "http://127.0.0.1:8265", "-m", "model=llama", exit_code=3)
    assert rc == 3
    assert set(ROOT.glob(".phasesweep_submission.*")) == before


def test_no_address_is_the_usage_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: ")


def test_a_dashboard_that_does_not_answer_stops_the_submission_before_ray(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, seen = submit(tmp_path, url, "-m", "model=llama", gcs=None)
    assert rc == 2 and seen == []  # `ray job submit` never ran
