"""Where a benchmark ran: CPU, GPU, library versions. Read on the worker that measures.
The machine's state around the timed window (cores, governor, load): tasks/measure/machine.py."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from tasks.measure.machine import allowed_cores

ALWAYS = ("numpy",)  # besides the libraries of the variant's export format and runtime
# peak DRAM bandwidth (GB/s) by GPU name substring, for `bandwidth_fraction_of_peak`;
# `device.peak_bandwidth_gbs` overrides it for anything not listed
PEAK_BANDWIDTH_GBS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 NVL": 3900.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "L40": 864.0,
    "L4": 300.0,
    "A10G": 600.0,
    "A10": 600.0,
    "T4": 320.0,
    "RTX 4090": 1008.0,
    "RTX 3090": 936.0,
}


def user_cache() -> Path:
    """This user's folder for what is measured or fetched once per machine ($XDG_CACHE_HOME/phasesweep)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "phasesweep"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict[str, str]:
    """Name, driver and memory of GPU 0 via nvidia-smi; empty where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, driver, memory = (s.strip() for s in out[0].split(","))
    return {"gpu_name": name, "gpu_driver": driver, "gpu_memory": memory, "gpu_count": str(len(out))}


def fingerprint(device: str, libraries: tuple[str, ...] = ()) -> dict[str, str]:
    """The machine, and the versions of `libraries` (the export format's and the runtime's)."""
    env = {
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "cpus_usable": str(len(allowed_cores())),  # as given to the process, before it pinned itself
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for lib in dict.fromkeys((*libraries, *ALWAYS)):
        try:
            env[f"version.{lib}"] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    if device == "cuda":
        env.update(gpu_info())
    return env


def peak_bandwidth_gbs(gpu_name: str) -> float | None:
    for key, value in PEAK_BANDWIDTH_GBS.items():  # most specific names first
        if key in gpu_name:
            return value
    return None
