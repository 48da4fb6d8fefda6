"""scripts/anchors/llamacpp.py: llama-bench relinked against the installed llama-cpp-python's shared libraries."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.anchors.llamacpp import SHARED, shared_link

NINJA = """
# Link the executable bin/llama-bench

build bin/llama-bench: CXX_EXECUTABLE_LINKER__llama-bench_Release tools/llama-bench/CMakeFiles/llama-bench.dir/main.cpp.o | tools/llama-bench/libllama-bench-impl.a src/libllama.a || src/libllama.a
  FLAGS = -O3 -DNDEBUG
  LINK_LIBRARIES = tools/llama-bench/libllama-bench-impl.a  common/libllama-common.a  src/libllama.a  ggml/src/libggml.a  -ldl  ggml/src/libggml-cpu.a  ggml/src/libggml-base.a  -lm  /usr/lib/libgomp.so
  OBJECT_DIR = tools/llama-bench/CMakeFiles/llama-bench.dir

build bin/other: CXX_EXECUTABLE_LINKER__other other.o
  LINK_LIBRARIES = src/libllama.a
"""


def test_the_static_archives_are_replaced_by_the_installed_shared_libraries_and_the_rest_kept():
    inputs, libraries = shared_link(NINJA, Path("/site/llama_cpp/lib"))
    assert inputs == ["tools/llama-bench/CMakeFiles/llama-bench.dir/main.cpp.o"]
    assert not set(SHARED) & set(libraries)
    kept = ["tools/llama-bench/libllama-bench-impl.a", "common/libllama-common.a", "-ldl", "-lm", "/usr/lib/libgomp.so"]
    assert libraries[: len(kept)] == kept
    assert libraries[len(kept) :] == ["-L/site/llama_cpp/lib", "-Wl,-rpath,/site/llama_cpp/lib", "-lllama", "-lggml", "-lggml-cpu", "-lggml-base"]


def test_a_link_without_an_archive_to_replace_is_refused_rather_than_linked_static():
    with pytest.raises(RuntimeError, match="libggml-cpu.a"):
        shared_link(NINJA.replace("ggml/src/libggml-cpu.a  ", ""), Path("/lib"))
    with pytest.raises(RuntimeError, match="no link of bin/llama-bench"):
        shared_link(NINJA.replace("bin/llama-bench:", "bin/llama-bench2:"), Path("/lib"))
