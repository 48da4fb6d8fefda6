"""Where a running sweep stands: variants queued, exporting, benchmarking, done, failed or
skipped, how long it has run and when it will end; nothing of Ray or MLflow.

The driver tells it what runs (`running`), which task returned (`returned`) and which variant
ended, with its line (`ended`); `tick` about every second. Shown plain when stdout is not a
terminal (each ended line and a `progress:` line now and then, through `emit`, so Hydra's job
log gets them), or live on a terminal (the same lines above a status line, never logged).
The ETA: each kind's mean task duration so far, times the tasks of that kind left (less what
the running ones have run), divided by how many of that kind were seen running at once.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from statistics import fmean
from typing import Any

from orchestrator.common.console import say
from orchestrator.common.outcome import Status

KINDS = ("export", "bench")


def clock_text(seconds: float) -> str:
    """0:41, 12:05, 1:02:03."""
    s = max(int(round(seconds)), 0)
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    def __init__(
        self,
        export_of: dict[str, str],
        repeats: dict[str, int] | None = None,
        skipped: int = 0,
        *,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] | None = None,
        live: bool | None = None,
        console: Any = None,
        every_s: float = 30.0,
        every_events: int = 5,
    ):
        """`export_of`: each variant to run -> its export key; `repeats`: its benchmark
        processes (1 if absent); `skipped`: variants skipped when planned. `live`: None
        decides by whether stdout is a terminal."""
        self.export_of = dict(export_of)
        self.repeats = {n: (repeats or {}).get(n, 1) for n in self.export_of}
        self.skipped = skipped
        self.clock, self.emit = clock, emit or say
        self.every_s, self.every_events = every_s, every_events
        self.live_wanted, self.console = live, console
        self.live: Any = None  # the rich Live while it is shown
        self.status: dict[str, str] = {}  # variant -> its status once ended
        self.exports_done: set[str] = set()
        self.benches_done: dict[str, int] = {}
        self.seen: dict[tuple[str, str], float] = {}  # running task -> when first seen running
        self.durations: dict[str, list[float]] = {k: [] for k in KINDS}
        self.peak: dict[str, int] = {k: 1 for k in KINDS}
        self.t0 = self.last_event = self.last_line = clock()
        self.since_line = 0

    @classmethod
    def of(cls, plan: Any, **kwargs: Any) -> Progress:
        """The progress of a planned sweep (orchestrator.plan.planner.Plan)."""
        return cls(
            {pv.name: pv.export_key for pv in plan.variants},
            {pv.name: pv.bench.bench.repeats for pv in plan.variants},
            len(plan.skipped),
            **kwargs,
        )

    # -- what happened ------------------------------------------------------------------
    def running(self, tasks: Iterable[tuple[str, str]]) -> None:
        """The (kind, key) of every task the scheduler is running now (kind "export" with
        the export key, or "bench" with `name#repeat`)."""
        now, current = self.clock(), set(tasks)
        for task in current:
            self.seen.setdefault(task, now)
        for task in set(self.seen) - current:  # handed back to the queue (a retry): its time is lost
            del self.seen[task]
        for kind in KINDS:
            self.peak[kind] = max(self.peak[kind], sum(1 for k, _ in current if k == kind))

    def returned(self, kind: str, key: str) -> None:
        """A task returned (a result or a failure): its duration teaches the ETA."""
        now = self.clock()
        started = self.seen.pop((kind, key), self.last_event)  # ended before it was seen running
        self.durations[kind].append(max(now - started, 0.0))
        self.last_event = now
        if kind == "export":
            self.exports_done.add(key)
        else:
            name = key.rsplit("#", 1)[0]
            self.benches_done[name] = self.benches_done.get(name, 0) + 1

    def ended(self, name: str, status: str, line: str | None = None) -> None:
        """A variant ended; `line` says so (None: nothing to print, e.g. reused)."""
        self.status[name] = str(status)
        if line is not None:
            self.emit(line)
        self.since_line += 1
        if line is not None and self.live is None and self.since_line >= self.every_events:
            self.print_line()
        self.refresh()

    def tick(self) -> None:
        if self.live is None and self.clock() - self.last_line >= self.every_s:
            self.print_line()
        self.refresh()

    # -- what it adds up to ---------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("queued", "exporting", "benchmarking", "done", "failed", "aborted"), 0)
        out["skipped"] = self.skipped
        running = set(self.seen)
        for name, key in self.export_of.items():
            status = self.status.get(name)
            if status == Status.OK:
                out["done"] += 1
            elif status is not None:  # failed, aborted (or skipped)
                out[status if status in ("aborted", "skipped") else "failed"] += 1
            elif any(("bench", f"{name}#{r}") in running for r in range(self.repeats[name])):
                out["benchmarking"] += 1
            elif ("export", key) in running:
                out["exporting"] += 1
            else:
                out["queued"] += 1
        return out

    def eta(self) -> float | None:
        """Seconds until the last variant ends, or None while a kind of task still to run
        has no finished one to learn from."""
        now = self.clock()
        open_ = [n for n in self.export_of if n not in self.status]
        left: dict[str, list[float]] = {k: [] for k in KINDS}  # each task to run: how long it has run
        for key in {self.export_of[n] for n in open_} - self.exports_done:
            started = self.seen.get(("export", key))
            left["export"].append(0.0 if started is None else now - started)
        for name in open_:
            done = self.benches_done.get(name, 0)
            for r in range(self.repeats[name]):
                started = self.seen.get(("bench", f"{name}#{r}"))
                if started is not None:
                    left["bench"].append(now - started)
                elif done:
                    done -= 1  # which repeats returned is not tracked, only how many
                else:
                    left["bench"].append(0.0)
        total = 0.0
        for kind in KINDS:
            if not left[kind]:
                continue
            if not self.durations[kind]:
                return None
            mean = fmean(self.durations[kind])
            total += sum(max(mean - ran, 0.0) for ran in left[kind]) / self.peak[kind]
        return total

    def text(self) -> str:
        """progress: 3/8 done, 1 failed, 2 benchmarking, 2 queued, elapsed 0:41, eta 1:10"""
        c = self.counts()
        parts = [f"{c['done']}/{len(self.export_of)} done"]
        parts += [
            f"{c[k]} {k}" for k in ("failed", "aborted", "exporting", "benchmarking", "queued", "skipped") if c[k]
        ]
        parts.append(f"elapsed {clock_text(self.clock() - self.t0)}")
        if c["exporting"] + c["benchmarking"] + c["queued"]:
            eta = self.eta()
            parts.append(f"eta {'?' if eta is None else clock_text(eta)}")
        return "progress: " + ", ".join(parts)

    def print_line(self) -> None:
        self.emit(self.text())
        self.last_line, self.since_line = self.clock(), 0

    # -- the live display -----------------------------------------------------------------
    def _render(self) -> Any:
        from rich.progress_bar import ProgressBar  # lazy: rich, only for a terminal's live display
        from rich.table import Table  # lazy: rich, only for a terminal's live display

        ended = len(self.status)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")  # one line, however narrow the terminal
        grid.add_row(ProgressBar(total=max(len(self.export_of), 1), completed=ended, width=20), self.text())
        return grid

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render(), refresh=True)

    @contextmanager
    def showing(self):
        """While inside: the live status line on a terminal (plain lines otherwise); on the
        way out, the final progress line. The clock starts here."""
        self.t0 = self.last_event = self.last_line = self.clock()
        wanted = self.live_wanted
        console = self.console
        if wanted is not False:
            from rich.console import Console  # lazy: rich, only for a terminal's live display

            console = console or Console(file=sys.stdout)
            if wanted is None:
                wanted = console.is_terminal and not console.is_dumb_terminal
        swapped: list[tuple[logging.StreamHandler, Any]] = []
        if wanted:
            from rich.file_proxy import FileProxy  # lazy: rich, only for a terminal's live display
            from rich.live import Live  # lazy: rich, only for a terminal's live display

            self.live = Live(
                self._render(),
                console=console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self.live.start(refresh=True)
            # the logging handlers hold the streams they were given: their lines go above the
            # status line (printed once each: the file handlers are left as they are)
            for logger in (logging.getLogger("phasesweep"), logging.getLogger()):
                for h in logger.handlers:
                    if type(h) is logging.StreamHandler and h.stream in (sys.__stdout__, sys.__stderr__, console.file):
                        swapped.append((h, h.stream))
                        h.setStream(FileProxy(console, h.stream))
        try:
            yield self
        finally:
            if self.live is not None:
                for h, stream in swapped:
                    h.setStream(stream)
                self.live.stop()
                self.live = None
            self.print_line()
