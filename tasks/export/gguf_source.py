"""llama.cpp's own source, at the commit the installed llama-cpp-python vendors: its converter
(convert_hf_to_gguf.py, with its `conversion` package and gguf-py) makes GGUF files
(tasks/export/gguf.py), and scripts/bench_vs_runtime_exporters.py builds its llama-bench. The
wheel holds neither, so the package's sdist is fetched once with pip (from the registry, as
the install itself) into a cache folder; PHASESWEEP_LLAMACPP_SOURCE names another llama.cpp
checkout instead. Torch-free.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from tasks.measure.environment import user_cache

DISTRIBUTION = "llama-cpp-python"
SOURCE_ENV = "PHASESWEEP_LLAMACPP_SOURCE"  # a llama.cpp folder (holding convert_hf_to_gguf.py) to use instead
CONVERTER = "convert_hf_to_gguf.py"


def version() -> str:
    return metadata.version(DISTRIBUTION)


def source_dir() -> Path:
    """The llama.cpp folder whose converter and tools match the installed llama-cpp-python."""
    if chosen := os.environ.get(SOURCE_ENV):
        folder = Path(chosen)
        if not (folder / CONVERTER).is_file():
            raise FileNotFoundError(f"{SOURCE_ENV}={chosen}: no {CONVERTER} there (a llama.cpp checkout's root)")
        return folder
    root = user_cache() / f"{DISTRIBUTION}-{version()}"
    if not (root / "vendor" / "llama.cpp" / CONVERTER).is_file():
        fetch(root)
    return root / "vendor" / "llama.cpp"


def fetch(root: Path) -> None:
    """The sdist of the installed version, unpacked into `root` (renamed into place whole: a
    concurrent fetch that finishes first keeps its copy)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    pinned = f"{DISTRIBUTION}=={version()}"
    with tempfile.TemporaryDirectory(prefix=".llama-cpp-source-", dir=root.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", pinned, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"fetching llama.cpp's source ({' '.join(cmd)}) failed:\n{done.stderr[-2000:]}")
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (unpacked,) = (p for p in Path(tmp).iterdir() if p.is_dir())
        try:
            os.replace(unpacked, root)
        except OSError:
            if not root.is_dir():
                raise
