"""Two benchmarks timed interleaved: A and B each loaded in a fresh process of its own, then
short blocks of calls of each, in a random order every round, on the same cores, until the
paired ratio B / A is precise enough or time runs out.

A drift of the machine's speed (another process, a VM's core slowed for seconds) falls on
both sides of a round alike, so the per-round ratio of block medians cancels it where two
sweeps measured at different times cannot. Only one side runs at a time; the other waits
on its pipe. Nothing here imports Ray or MLflow: the driver places the job like a benchmark.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tasks.measure.bench import probe, wall_clock, warm_up
from tasks.measure.effect import band, side
from tasks.measure.latency import median_ci_ranks
from tasks.measure.machine import benchmark_cores, die_with_parent
from tasks.runtimes import runtime_module
from tasks.specs import BenchSpec, Failure
from tasks.worker import envs
from tasks.worker.entries import load_export
from tasks.worker.fresh import importing_from

SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class PairOptions:
    max_seconds: float = 120.0  # timed rounds stop here whatever the interval
    target_ci: float = 0.01  # stop once the ratio's 95% interval half-width is within this of it,
    min_effect: float = 0.05  # or once the interval lies beyond 1 +- this or within it (the verdict is decided),
    decide_growth: float = 1.5  # looked at only when the rounds have grown by this factor (fewer looks, less peeking)
    min_rounds: int = 12  # never stop before (a median's 95% interval needs 6 or more)
    max_rounds: int = 400
    block_seconds: float = 0.2  # each side's block of calls per round lasts about this,
    block_calls: int = 4  # and holds at least this many calls
    load_timeout_s: float = 600.0  # each side's load, first call and warm-up
    seed: int = 0  # the order of the sides in each round


@dataclass(frozen=True)
class PairSpec:
    name: str  # the variant both sides measure
    baseline: BenchSpec
    candidate: BenchSpec
    options: PairOptions = field(default_factory=PairOptions)
    # side -> folders put first on its process's import path: a side's own checkout of an
    # out-of-tree runtime (orchestrator.bisect times two commits of one module); a side's env.pip
    # environment goes before them (two library versions timed interleaved)
    paths: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class PairResult:
    name: str
    ok: bool = False
    failure: Failure | None = None
    block_ns: dict[str, list[float]] = field(default_factory=dict)  # per side, each round's block median
    samples_ns: dict[str, list[int]] = field(default_factory=dict)  # per side, every timed call
    calls_per_block: dict[str, int] = field(default_factory=dict)
    probe_ns: list[int] = field(default_factory=list)  # the machine-speed probe, after each block
    ratios: list[float] = field(default_factory=list)  # candidate / baseline, per round
    ratio: float | None = None  # median of `ratios`
    ci: tuple[float, float] | None = None  # its distribution-free 95% interval
    stop: str = ""  # target | decided | time | rounds
    seconds: float = 0.0
    node: str = ""  # the Ray node it ran on, when it ran as a task


def ratio_interval(ratios: list[float]) -> tuple[float, tuple[float, float] | None]:
    """The median of the per-round ratios and its distribution-free 95% interval (None below 6 rounds)."""
    a = np.sort(np.asarray(ratios, dtype=np.float64))
    ranks = median_ci_ranks(a.size)
    med = float(np.median(a))
    return med, None if ranks is None else (float(a[ranks[0]]), float(a[ranks[1]]))


def decided(ci: tuple[float, float], min_effect: float) -> bool:
    """The interval lies wholly beyond 1 +- min_effect (slower or faster) or wholly within it (same)."""
    return side(ci, *band(min_effect)) != "across"


def _side_main(conn: Any, spec: BenchSpec) -> None:
    """A side's process (its folders first on its import path from its start): load, first
    call, warm-up, then time blocks on request."""
    die_with_parent()
    try:
        benchmark_cores(spec.device, spec.bench.threads)  # pinned before loading: thread pools inherit it
        meta, feeds, _ = load_export(spec.export_dir)
        session = runtime_module(spec.runtime).load(spec, meta, feeds)
        call = session.bind(feeds)
        timed = session.timer() or wall_clock(session.sync)
        with session.timed_region():
            timed(call)
            _, _, median = warm_up(timed, call, spec.bench)
            conn.send(("ready", median))
            while (msg := conn.recv())[0] == "block":
                gc.freeze()
                gc.disable()
                try:
                    samples = [timed(call) for _ in range(msg[1])]
                    probes: list[int] = []
                    probe(probes, 1)
                finally:
                    gc.enable()
                conn.send(("block", samples, probes))
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    conn.close()


class _Side:
    def __init__(self, role: str, spec: BenchSpec, timeout_s: float, path: tuple[str, ...] = ()):
        ctx = multiprocessing.get_context("spawn")
        self.role, self.conn = role, None
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_side_main, args=(child, spec), name=f"phasesweep-pair-{role}")
        with importing_from(path):  # spawn copies sys.path: the side imports its own libraries from the start
            self.proc.start()
        child.close()
        self.conn = parent
        try:
            self.median_ns = float(self._reply(timeout_s)[1])
        except BaseException:
            self.close()
            raise

    def _reply(self, timeout_s: float | None) -> tuple:
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"the {self.role} side gave no answer within {timeout_s:g} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"the {self.role} side's process died (exit status {self.proc.exitcode})") from None
        if msg[0] == "failed":
            raise RuntimeError(f"the {self.role} side failed: {msg[1]}")
        return msg

    def block(self, calls: int) -> tuple[list[int], list[int]]:
        self.conn.send(("block", calls))
        _, samples, probes = self._reply(None)
        return samples, probes

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def env_site(bench: BenchSpec) -> tuple[str, ...]:
    """The side's env.pip environment, made or found on this node: its folder; () for none."""
    return (envs.ensure(bench.env, bench.export_dir).site,) if bench.env.pip else ()


def paired_job(spec: PairSpec) -> PairResult:
    """The interleaved measurement of spec.baseline and spec.candidate; never raises for the
    sides' own failures (the result's `failure` says which side and why)."""
    opts = spec.options
    result = PairResult(spec.name)
    sides: dict[str, _Side] = {}
    try:
        for role, bench in zip(SIDES, (spec.baseline, spec.candidate), strict=True):
            path = (*env_site(bench), *spec.paths.get(role, ()))
            sides[role] = _Side(role, bench, opts.load_timeout_s, path)  # one at a time: loads never overlap
        for role, side in sides.items():
            calls = round(opts.block_seconds * 1e9 / max(side.median_ns, 1.0))
            result.calls_per_block[role] = max(opts.block_calls, min(10_000, calls))
            result.block_ns[role], result.samples_ns[role] = [], []
        rng = random.Random(opts.seed)
        start, look = time.perf_counter(), opts.min_rounds
        while True:
            order = list(SIDES)
            rng.shuffle(order)
            for role in order:
                samples, probes = sides[role].block(result.calls_per_block[role])
                result.samples_ns[role] += samples
                result.block_ns[role].append(float(np.median(samples)))
                result.probe_ns += probes
            result.ratios.append(result.block_ns["candidate"][-1] / result.block_ns["baseline"][-1])
            rounds, elapsed = len(result.ratios), time.perf_counter() - start
            result.ratio, result.ci = ratio_interval(result.ratios)
            if rounds >= opts.min_rounds and result.ci is not None:
                if (result.ci[1] - result.ci[0]) / 2 <= opts.target_ci * result.ratio:
                    result.stop = "target"
                    break
                if rounds >= look:
                    look = max(rounds + 1, round(rounds * opts.decide_growth))
                    if decided(result.ci, opts.min_effect):
                        result.stop = "decided"
                        break
            if elapsed >= opts.max_seconds:
                result.stop = "time"
                break
            if rounds >= opts.max_rounds:
                result.stop = "rounds"
                break
        result.seconds = time.perf_counter() - start
        result.ok = result.ci is not None
        if not result.ok:
            result.failure = Failure("benchmark", f"{len(result.ratios)} rounds in {opts.max_seconds:g} s: too few for an interval")
    except Exception as exc:
        result.failure = Failure("benchmark", str(exc), traceback.format_exc())
    finally:
        for side in sides.values():
            side.close()
    return result
