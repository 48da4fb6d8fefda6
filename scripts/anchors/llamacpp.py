"""llama.cpp contenders for the side-by-side benchmark: one GGUF file, run two ways.

  phasesweep   phasesweep's GGUF (tasks/export/gguf.py, through tasks.jobs.export_job) run by its
               llama.cpp session (tasks/runtimes/llamacpp.py), timed by the caller call by call
  llama_bench  llama.cpp's own `llama-bench`, built from the same llama.cpp source the installed
               llama-cpp-python vendors (tasks/export/gguf_source.py) and linked against the
               shared libraries llama-cpp-python installed (the very libllama and libggml-cpu
               phasesweep's session runs), on the same file with the same threads; it times
               itself: `-p P -n 0` (a prompt of P tokens) and `-p 0 -n 1 -d C` (one token after
               a depth of C), its per-repetition samples read from its JSON output
  llama_bench_static  the same llama-bench as cmake links it: llama.cpp's libraries built
               static, without -fPIC. The build, not the harness: on a 2-core AMD EPYC its
               float32 decode took about 12% less CPU time per token than the installed
               shared libraries, whoever called them (llama-bench, a C loop or phasesweep)

llama-bench is built once with cmake into ~/.cache/phasesweep/llama-bench-<version>/ (outside
the repository; minutes on a busy machine), then its objects relinked against the installed
libraries (seconds).

    contenders = build(Path("ckpt"), Path("work"), threads=2, quant="none")
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from scripts.anchors.onnxruntime import PARITY_STEPS, Contender, export_entry
from tasks.export.gguf_source import source_dir, version
from tasks.measure.environment import user_cache
from tasks.runtimes.llamacpp import repack
from tasks.specs import BenchOptions, BenchSpec, ModelSpec, PhaseSpec

# what the script's cmake leaves out: only the library and llama-bench are built
CMAKE_OPTIONS = ["-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release"]  # fmt: skip


# the phasesweep session's settings for a float32 model (tasks/runtimes/llamacpp.py) with
# backend.options.cache_type=f16 (llama-bench takes no f32 cache): flash attention off, an F16 cache;
# n_ubatch 512 is both's default
SETTINGS = ["-fa", "off", "-ctk", "f16", "-ctv", "f16"]
CACHE = {"cache_type": "f16"}


def repack_flag() -> list[str]:
    """llama-bench's --repack as the phasesweep session decides it (backend.options.repack=auto)."""
    import llama_cpp  # lazy: llama.cpp's library, only when llama-bench is timed

    return ["--repack", "1" if repack(llama_cpp, "auto") else "0"]


class ProcessTimed:
    """A contender's block timed by its own tool: `block(n)` -> n per-call times (ms)."""

    def __init__(self, run: Callable[[int], list[float]]):
        self.block = run


# the static archives of llama.cpp's libraries in cmake's link of llama-bench, and the installed
# shared library (llama_cpp/lib/lib<name>.so) each is replaced with
SHARED = {"src/libllama.a": "llama", "ggml/src/libggml.a": "ggml", "ggml/src/libggml-cpu.a": "ggml-cpu", "ggml/src/libggml-base.a": "ggml-base"}


def llama_bench() -> Path:
    """llama-bench of the installed llama-cpp-python's llama.cpp, built once (static, as cmake links it)."""
    folder = user_cache() / f"llama-bench-{version()}"
    binary = folder / "build" / "bin" / "llama-bench"
    if not binary.is_file():
        source = source_dir()
        subprocess.run(["cmake", "-S", str(source), "-B", str(folder / "build"), "-G", "Ninja", *CMAKE_OPTIONS], check=True)
        subprocess.run(["cmake", "--build", str(folder / "build"), "--target", "llama-bench"], check=True)
    return binary


def installed_libraries() -> Path:
    """The folder of the shared libraries llama-cpp-python loads (llama_cpp/lib)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise RuntimeError("llama-cpp-python is not installed: pip install -e '.[llamacpp]'")
    folder = Path(spec.origin).parent / "lib"
    missing = [name for name in SHARED.values() if not (folder / f"lib{name}.so").exists()]
    if missing:
        raise RuntimeError(f"{folder}: no lib{', lib'.join(missing)}.so (a llama-cpp-python built without its shared libraries?)")
    return folder


def shared_link(ninja: str, libraries: Path) -> tuple[list[str], list[str]]:
    """cmake's link of bin/llama-bench (its build.ninja's text) with llama.cpp's static archives
    replaced by the shared libraries in `libraries`: (inputs, libraries) for the linker."""
    block = ninja.split("\nbuild bin/llama-bench:", 1)
    if len(block) < 2:
        raise RuntimeError("build.ninja: no link of bin/llama-bench")
    rule, _, _ = block[1].partition("\n\n")
    inputs = rule.split("|", 1)[0].split()[1:]  # after the rule's name: the objects
    found = re.search(r"^\s+LINK_LIBRARIES = (.*)$", rule, re.M)
    if not inputs or not found:
        raise RuntimeError("build.ninja: the link of bin/llama-bench names no objects or libraries")
    linked = found.group(1).split()
    absent = [archive for archive in SHARED if archive not in linked]
    if absent:
        raise RuntimeError(f"build.ninja: llama-bench's link has no {', '.join(absent)} to replace")
    shared = [f"-L{libraries}", f"-Wl,-rpath,{libraries}"]
    return inputs, [a for a in linked if a not in SHARED] + shared + [f"-l{SHARED[a]}" for a in SHARED]


def llama_bench_shared() -> Path:
    """llama-bench's objects linked against the installed llama-cpp-python's shared libraries, once."""
    static = llama_bench()
    build = static.parents[1]
    binary = build / "bin" / "llama-bench-shared"
    if not binary.is_file():
        inputs, libraries = shared_link((build / "build.ninja").read_text(), installed_libraries())
        cache = (build / "CMakeCache.txt").read_text()
        compiler = re.search(r"^CMAKE_CXX_COMPILER:FILEPATH=(.*)$", cache, re.M)
        cxx = compiler.group(1) if compiler else "c++"
        subprocess.run([cxx, "-O3", "-DNDEBUG", *inputs, "-o", str(binary), *libraries], cwd=build, check=True)
    return binary


class SweepContender(Contender):
    """phasesweep's GGUF and llama.cpp session, as a sweep's benchmark runs them (tasks.jobs)."""

    def __init__(self, checkpoint: Path, work: Path, threads: int, quant: str):
        self.model = ModelSpec(name="llama", family="llama", size="checkpoint", arch={}, checkpoint=str(checkpoint.resolve()), quant=quant)
        self.work, self.threads = work, threads

    def export(self, phase: PhaseSpec) -> tuple[str, BenchSpec]:
        """The export entry of this phase (made once, in work/exports) and a bench spec for it."""
        from tasks.phases import phase_module

        phase = phase_module(phase.name).normalize(phase, self.model.kv_cache)  # decode's cache_len, as a sweep plans it
        out = export_entry(self.work, self.model, phase, "gguf", f"gguf_{phase.name}_{self.model.quant}", {})
        bench = BenchSpec(
            out.name, "llamacpp", "cpu", self.model, phase, str(out), bench=BenchOptions(threads=self.threads), runtime_options=CACHE
        )
        return str(out), bench

    def session(self, phase: PhaseSpec) -> tuple[Callable[[], None], Path]:
        """The bound call, parity-checked against transformers first, and its GGUF file."""
        from tasks.measure.parity import quantized, tolerance
        from tasks.phases import phase_module
        from tasks.runtimes import runtime_module
        from tasks.worker.entries import load_export

        out, bench = self.export(phase)
        meta, feeds, parity = load_export(out)
        session = runtime_module("llamacpp").load(bench, meta, feeds)
        atol = tolerance("float16", None)  # the F16 cache rounds every cached key and value
        report = phase_module(phase.name).check_parity(session, phase, feeds, parity, atol)
        if self.model.quant != "none":
            report = quantized(report, self.model.quant)
        if not report["passed"]:
            raise RuntimeError(f"llamacpp: parity failed at {phase}: {report}")
        self.keep = session  # the bound call's context lives as long as the contender
        return session.bind(feeds), Path(out) / meta["artifact"]

    def decode(self, context_len: int) -> Callable[[], None]:
        return self.session(PhaseSpec("decode", batch=1, context_len=context_len, parity_steps=PARITY_STEPS))[0]

    def prefill(self, prompt_len: int) -> Callable[[], None]:
        return self.session(PhaseSpec("prefill", batch=1, prompt_len=prompt_len))[0]


class BenchContender(Contender):
    """llama-bench on the file the phasesweep contender made for the same phase and length."""

    def __init__(self, ours: SweepContender, threads: int, binary: Path):
        self.ours, self.threads, self.binary = ours, threads, binary
        self.repack = repack_flag()  # as the phasesweep session loads the same file

    def _timed(self, phase: PhaseSpec, flags: list[str]) -> ProcessTimed:
        out, _ = self.ours.export(phase)
        meta = json.loads((Path(out) / "meta.json").read_text())
        model = str(Path(out) / meta["artifact"])

        def block(n: int) -> list[float]:
            cmd = [str(self.binary), "-m", model, "-t", str(self.threads), *SETTINGS, *self.repack, *flags, "-r", str(n), "-o", "json"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            (test,) = json.loads(done.stdout)
            return [ns / 1e6 for ns in test["samples_ns"]]

        return ProcessTimed(block)

    def decode(self, context_len: int) -> ProcessTimed:  # type: ignore[override]
        phase = PhaseSpec("decode", batch=1, context_len=context_len, parity_steps=PARITY_STEPS)
        return self._timed(phase, ["-p", "0", "-n", "1", "-d", str(context_len)])

    def prefill(self, prompt_len: int) -> ProcessTimed:  # type: ignore[override]
        return self._timed(PhaseSpec("prefill", batch=1, prompt_len=prompt_len), ["-p", str(prompt_len), "-n", "0"])


def build(checkpoint: Path, work: Path, threads: int, quant: str = "none") -> dict[str, Contender]:
    ours = SweepContender(Path(checkpoint), Path(work), threads, quant)
    return {
        "phasesweep": ours,
        "llama_bench": BenchContender(ours, threads, llama_bench_shared()),
        "llama_bench_static": BenchContender(ours, threads, llama_bench()),
    }
