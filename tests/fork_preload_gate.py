"""Imported by a test's fork server (tests/test_forks.py): the import, hence the server's
start, waits until the file named by PHASESWEEP_TEST_GATE exists."""

import os
import time
from pathlib import Path

_gate = Path(os.environ["PHASESWEEP_TEST_GATE"])
while not _gate.exists():
    time.sleep(0.02)
