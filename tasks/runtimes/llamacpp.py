"""llama.cpp on the CPU: the GGUF format's file (tasks/export/gguf.py) run through llama.cpp's own
C API, as llama-cpp-python binds it (llama_decode on a llama_batch), with no Python layer of
its own between the harness and the library. Imports no torch.

llama.cpp keeps the KV cache inside its context (n_ctx cells, allocated when the context is
made). A call decodes its tokens at their positions after dropping every cell from its first
position on, so a call repeats exactly:
  prefill  the prompt's P tokens at positions 0..P-1, one batch (the cache cleared first), as
           `llama-bench -p P` times it; the last position's logits
  decode   one token at position C, after the context's C tokens were decoded once into the
           cache (the phase's CONTEXT feed), as `llama-bench -n 1 -d C` times it
Parity steps through llama.cpp's own cache (run_steps), each step's logits read back with
llama_get_logits_ith.

How it is set, each recorded as a param: n_threads and n_threads_batch from bench.threads (0:
the cores the benchmark holds); n_ctx the phase's capacity (decode's cache_len, prefill's
prompt_len), times phase.batch; n_batch n_ctx (a prompt is one batch); n_ubatch min(n_ctx, 512), llama-bench's;
for a float32 model the cache F32 and flash attention off (llama.cpp's F16 cache and its CPU
flash-attention kernel, which rounds the queries to F16, put the logits 5e-4 off the reference's
at the first position); otherwise llama.cpp's defaults (an F16 cache, flash attention auto). phase.batch rows are as many sequences of one
context (n_seq_max), each with the capacity's cells.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from tasks.contract import Runtime
from tasks.measure.session import Session
from tasks.specs import BenchSpec, choice

UBATCH = 512  # llama-bench's default n_ubatch
CACHE_TYPES = ("auto", "f32", "f16")  # auto: f32 for a float32 model, else llama.cpp's default f16
REPACK = ("auto", "true", "false")
AMX = "AMX_INT8 = 1"  # in llama.cpp's system info where its build runs its AMX kernels


@dataclass(frozen=True)
class Options:
    cache_type: str = "auto"  # the KV cache's type (llama-bench takes f16, not f32: compare with f16)
    # llama.cpp's extra weight buffers (llama-bench's --repack): its CPU repacking, and its AMX
    # buffer where the build has AMX. auto: llama.cpp's default (on), but off on an AMX build
    repack: str = "auto"

    def __post_init__(self) -> None:
        choice("backend.options.cache_type", self.cache_type, CACHE_TYPES)
        choice("backend.options.repack", self.repack, REPACK)


def repack(lc: Any, option: str) -> bool:
    """Whether llama.cpp loads quantised weights into its extra buffers (use_extra_bufts). auto is
    on, as llama.cpp's own default, except where its build runs AMX (its system info says
    AMX_INT8 = 1): there its AMX matmul kills the process at the first quantised call (a llama.cpp
    bug, reproduced with llama-cpp-python 0.3.36 on tiny and smollm2-135m models alike)."""
    if option != "auto":
        return option == "true"
    return AMX not in lc.llama_print_system_info().decode(errors="replace")


WARN = 3  # GGML_LOG_LEVEL_WARN: llama.cpp's notes below it (every load prints dozens) are dropped


def _log(level: int, text: bytes, user_data: Any) -> None:
    if level >= WARN:
        sys.stderr.write(text.decode(errors="replace"))


_CALLBACKS: list[Any] = []  # the ctypes callback, made once in a job's process and kept alive there


def _log_callback(lc: Any) -> Any:
    if not _CALLBACKS:
        _CALLBACKS.append(lc.llama_log_callback(_log))
    return _CALLBACKS[0]


class LlamaCppSession(Session):
    def __init__(self, path: Path, spec: BenchSpec):
        # lazy: llama.cpp's library, only in a job's process
        import llama_cpp as lc

        self.lc, self.model, self.ctx = lc, None, None
        lc.llama_log_set(_log_callback(lc), None)
        self.batches: list[Any] = []  # the session's batch and each bound call's own, freed with it
        if spec.device != "cpu":
            raise RuntimeError(f"device={spec.device}: the llamacpp backend runs on cpu only")
        lc.llama_backend_init()
        opts = Options(**spec.runtime_options)
        loading = lc.llama_model_default_params()
        loading.use_extra_bufts = repack(lc, opts.repack)
        self.model = lc.llama_model_load_from_file(str(path).encode(), loading)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        threads = spec.bench.threads or len(os.sched_getaffinity(0))
        rows = spec.phase.batch  # one sequence of the context per row, each with capacity cells
        capacity = rows * (spec.phase.cache_len or spec.phase.prompt_len)
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = capacity, capacity, min(capacity, UBATCH), rows
        params.n_threads = params.n_threads_batch = threads
        if spec.model.dtype == "float32":  # its CPU flash-attention kernel rounds the queries to F16
            params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cache = opts.cache_type
        if cache == "f32" or (cache == "auto" and spec.model.dtype == "float32"):  # llama.cpp's F16 cache rounds every key
            params.type_k = params.type_v = lc.GGML_TYPE_F32
        params.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {capacity} cells for {path}")
        self.memory = lc.llama_get_memory(self.ctx)
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = self._batch(capacity)
        self.output_names = ["logits"]
        self.metrics = {}
        self.info = {
            "llamacpp_n_threads": lc.llama_n_threads(self.ctx),
            "llamacpp_n_threads_batch": lc.llama_n_threads_batch(self.ctx),
            "llamacpp_n_ctx": lc.llama_n_ctx(self.ctx),
            "llamacpp_n_batch": lc.llama_n_batch(self.ctx),
            "llamacpp_n_ubatch": lc.llama_n_ubatch(self.ctx),
            "llamacpp_flash_attn": lc.llama_flash_attn_type_name(params.flash_attn_type).decode(),
            "llamacpp_cache_type": "f32" if params.type_k == lc.GGML_TYPE_F32 else "f16",
            "llamacpp_version": metadata.version("llama-cpp-python"),
            "llamacpp_repack": str(bool(loading.use_extra_bufts)).lower(),
        }

    def _batch(self, size: int) -> Any:
        batch = self.lc.llama_batch_init(size, 0, 1)
        self.batches.append(batch)
        return batch

    def _fill(self, batch: Any, ids: np.ndarray, start: int) -> None:
        """Row b's tokens [B, n] at positions start.. of sequence b, each row's last one's logits kept."""
        rows, n = ids.shape
        for b, row in enumerate(ids.tolist()):
            for j, token in enumerate(row):
                i = b * n + j
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + j, 1, j == n - 1
                batch.seq_id[i][0] = b
        batch.n_tokens = rows * n

    def _caller(self, batch: Any, start: int):
        """One call: the cells from `start` on dropped (a prompt at 0: the whole cache), the batch decoded."""
        lc, ctx, memory = self.lc, self.ctx, self.memory

        def call() -> None:
            if start == 0:
                lc.llama_memory_clear(memory, False)
            else:
                lc.llama_memory_seq_rm(memory, -1, start, -1)  # every sequence
            if failed := lc.llama_decode(ctx, batch):
                raise RuntimeError(f"llama_decode returned {failed}")

        return call

    def _logits(self, rows: int, n: int) -> np.ndarray:
        """Each row's last position's logits [B, 1, V] (the batch's outputs, by token index)."""
        out = [self.lc.llama_get_logits_ith(self.ctx, b * n + n - 1) for b in range(rows)]
        return np.stack([np.ctypeslib.as_array(r, shape=(self.vocab,)) for r in out]).astype(np.float32)[:, None]

    def step(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        """input_ids [B, n] at cache_position [n] (consecutive): each row's last logits [B, 1, V]."""
        ids, start = np.asarray(inputs["input_ids"]), int(inputs["cache_position"][0])
        self._fill(self.batch, ids, start)
        self._caller(self.batch, start)()
        return [self._logits(*ids.shape)]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.step(self.prepare(feeds))

    def bind(self, feeds: dict[str, np.ndarray]):
        """The context decoded into the cache once; the call's tokens in a batch of their own."""
        inputs = self.prepare(feeds)
        ids = np.asarray(inputs["input_ids"])
        batch = self._batch(ids.size)
        start = int(inputs["cache_position"][0])
        self._fill(batch, ids, start)
        return self._caller(batch, start)

    def sync(self) -> None:
        self.lc.llama_synchronize(self.ctx)

    def __del__(self) -> None:
        for batch in self.batches:
            self.lc.llama_batch_free(batch)
        if self.ctx:
            self.lc.llama_free(self.ctx)
        if self.model:
            self.lc.llama_model_free(self.model)


class LlamaCppRuntime(Runtime):
    Options = Options
    LIBRARIES = ("llama-cpp-python",)
    REQUIRES = ("llama-cpp-python",)
    PRELOAD = ("llama_cpp",)

    def load(self, spec: BenchSpec, meta: dict[str, Any], feeds: dict[str, np.ndarray]) -> LlamaCppSession:
        return LlamaCppSession(Path(spec.export_dir) / meta["artifact"], spec)


RUNTIME = LlamaCppRuntime()
