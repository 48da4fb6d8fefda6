"""orchestrator.run.progress.Progress without a terminal: counts, the ETA it learns (a fake
clock), the plain lines, and the live display kept off the log."""

from __future__ import annotations

import io
import logging

from orchestrator.record.links import ui_command, ui_lines, ui_links
from orchestrator.run.progress import Progress, clock_text

A, B, C = "llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu", "llama_decode_eager_cpu"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(live=False, **kwargs) -> tuple[Progress, Clock, list[str]]:
    clock, lines = Clock(), []
    # A and B share nothing; B and C share one export; B benchmarks in two processes
    p = Progress({A: "ka", B: "kb", C: "kb"}, {B: 2}, skipped=1, clock=clock, emit=lines.append, live=live, **kwargs)
    return p, clock, lines


def test_clock_text():
    assert [clock_text(s) for s in (0, 41.4, 725, 3723)] == ["0:00", "0:41", "12:05", "1:02:03"]


def test_counts_follow_the_tasks_the_scheduler_runs():
    p, clock, _ = make()
    with p.showing():
        assert p.counts() == {
            "queued": 3,
            "exporting": 0,
            "benchmarking": 0,
            "done": 0,
            "failed": 0,
            "aborted": 0,
            "skipped": 1,
        }
        p.running([("export", "ka"), ("export", "kb")])
        assert p.counts()["exporting"] == 3 and p.counts()["queued"] == 0
        clock.t += 10
        p.returned("export", "ka")
        p.running([("export", "kb"), ("bench", f"{A}#0")])
        c = p.counts()
        assert (c["exporting"], c["benchmarking"], c["queued"]) == (2, 1, 0)
        clock.t += 5
        p.returned("bench", f"{A}#0")
        p.running([("export", "kb")])
        p.ended(A, "ok", "  measured  A")
        assert p.counts()["done"] == 1
        p.ended(C, "failed", "  FAILED    C")
        assert p.counts()["failed"] == 1 and p.counts()["exporting"] == 1  # B still exports


def test_eta_learns_from_finished_tasks():
    p, clock, _ = make()
    with p.showing():
        assert p.eta() is None  # nothing finished: nothing to learn from
        p.running([("export", "ka")])
        clock.t += 20
        p.returned("export", "ka")  # exports take 20 s
        p.running([("export", "kb"), ("bench", f"{A}#0")])
        assert p.eta() is None  # no benchmark finished yet
        clock.t += 6
        p.returned("bench", f"{A}#0")  # a benchmark process takes 6 s
        p.ended(A, "ok")
        p.running([("export", "kb")])
        # export kb has run 6 s of its 20: 14 s left; then B's 2 processes and C's 1, 6 s each
        assert p.eta() == 14 + 3 * 6
        clock.t += 4
        assert p.eta() == 10 + 3 * 6  # the running export's share shrinks with the clock
        # two benchmarks seen at once: the benchmarks still to run share two slots
        p.returned("export", "kb")
        p.running([("bench", f"{B}#0"), ("bench", f"{C}#0")])
        assert p.eta() == (6 + 6 + 6) / 2
        clock.t += 30  # longer than the mean: a running task is not counted below zero
        assert p.eta() == 6 / 2


def test_a_retried_task_is_running_again_only_when_seen_again():
    p, clock, _ = make()
    with p.showing():
        p.running([("export", "ka")])
        clock.t += 100
        p.running([])  # the worker died: the task went back to the queue
        assert p.counts()["exporting"] == 0 and p.counts()["queued"] == 3
        p.running([("export", "ka")])
        clock.t += 5
        p.returned("export", "ka")
        assert p.durations["export"] == [5]  # the lost attempt's time does not count


def test_plain_lines_every_k_events_and_every_n_seconds():
    p, clock, lines = make(every_s=30, every_events=2)
    with p.showing():
        p.tick()
        assert lines == []
        clock.t += 31
        p.tick()
        assert lines == ["progress: 0/3 done, 3 queued, 1 skipped, elapsed 0:31, eta ?"]
        p.ended(A, "ok", "  measured  A")
        p.ended(C, "failed", "  FAILED    C")
        assert lines[1:] == [
            "  measured  A",
            "  FAILED    C",
            "progress: 1/3 done, 1 failed, 1 queued, 1 skipped, elapsed 0:31, eta ?",
        ]
        p.tick()  # the line just printed resets the clock of the next
        assert len(lines) == 4
        p.running([("export", "kb")])
        clock.t += 2
        p.returned("export", "kb")
        p.running([("bench", f"{B}#0")])
        clock.t += 3
        p.returned("bench", f"{B}#0")
        p.running([("bench", f"{B}#1")])
        clock.t += 1
        assert p.text() == "progress: 1/3 done, 1 failed, 1 benchmarking, 1 skipped, elapsed 0:37, eta 0:02"
        p.ended(B, "ok", "  measured  B")
    assert lines[-2:] == [
        "  measured  B",
        "progress: 2/3 done, 1 failed, 1 skipped, elapsed 0:37",
    ]  # the last line: no eta


def test_no_live_display_when_stdout_is_not_a_terminal(capsys):
    clock, lines = Clock(), []
    p = Progress({A: "ka"}, clock=clock, emit=lines.append)  # live=None: decided by stdout (captured here)
    with p.showing():
        assert p.live is None
        p.ended(A, "ok", "  measured  A")
        p.tick()
    assert capsys.readouterr().out == ""  # nothing drawn: every line went through emit
    assert lines == ["  measured  A", "progress: 1/1 done, elapsed 0:00"]


def test_live_display_on_a_terminal_logs_each_line_once(tmp_path):
    """On a terminal the status line is drawn, the ended lines go above it through the
    "phasesweep" logger's stream handler, and the job log gets the lines, not the status."""
    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    logger = logging.getLogger("phasesweep")
    to_screen = logging.StreamHandler(screen)
    to_log = logging.FileHandler(tmp_path / "job.log")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers[:] = [to_screen, to_log]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        clock = Clock()
        p = Progress({A: "ka", B: "kb"}, clock=clock, live=True, console=console)  # emit: say
        with p.showing():
            assert p.live is not None and to_screen.stream is not screen  # routed above the status line
            p.running([("export", "ka")])
            clock.t += 3
            p.tick()
            p.returned("export", "ka")
            p.ended(A, "ok", "  measured  A")
        assert to_screen.stream is screen  # given back
    finally:
        logger.handlers[:], level, logger.propagate = saved[0], saved[1], saved[2]
        logger.setLevel(level)
        to_log.close()
    drawn = screen.getvalue()
    assert "progress: 0/2 done, 1 exporting, 1 queued, elapsed 0:03" in drawn  # the live status line
    assert "  measured  A" in drawn
    log = (tmp_path / "job.log").read_text().splitlines()
    assert log == ["  measured  A", "progress: 1/2 done, 1 queued, elapsed 0:03, eta ?"]  # no status redraws


def test_ui_links_open_the_runs_not_the_overview():
    links = ui_links("http://mlflow.example:5000/", "7", "abc")
    assert links == {
        "runs": "http://mlflow.example:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=phasesweep",
        "run": "http://mlflow.example:5000/#/experiments/7/runs/abc?workflowType=machine_learning",
    }
    local = "sqlite:////tmp/x/mlflow.db"
    assert ui_command(local) == "mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db --port 5000"
    assert ui_lines(local, "1", "r1") == [
        "MLflow UI, once `mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db --port 5000` runs:",
        "  this sweep's run:  http://127.0.0.1:5000/#/experiments/1/runs/r1?workflowType=machine_learning",
        "  all runs (table):  http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=phasesweep",
    ]
    assert (
        ui_command("https://mlflow.example", "7")
        == "open https://mlflow.example/#/experiments/7/runs?" + links["runs"].split("?")[1]
    )
    assert ui_lines("fake://tracker", "1", "r1") == [] and ui_lines(local, None) == []


def test_the_experiment_tags_open_the_classic_view_on_the_figures():
    """The view the runs link opens by its key: valid JSON the UI reads, the runs sorted by median
    latency, the figures a user decides by as columns."""
    import json

    from orchestrator.record.links import VIEW_KEY, experiment_tags

    tags = experiment_tags()
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
    assert view["orderByKey"] == "metrics.`latency_ms_median`" and view["orderByAsc"] is True
    for column in ("latency_ms_median", "tokens_per_s", "parity_max_abs_diff", "quality_ppl_increase"):
        assert f"metrics.`{column}`" in view["selectedColumns"]
    assert "tags.`status`" in view["selectedColumns"]


def test_the_sweep_note_shows_the_plots_through_the_uis_artifact_route():
    from orchestrator.read.summary import sweep_note

    rows = [{"variant": "a", "median_ms": "1.000"}]
    note = sweep_note("python sweep.py -m", rows, plots=("latency.png", "plots/speed up.png"), run_id="r1")
    assert note.index("| a ") < note.index("**Plots**")
    assert "![latency](get-artifact?path=latency.png&run_uuid=r1)" in note
    assert "![speed up](get-artifact?path=plots/speed%20up.png&run_uuid=r1)" in note
    assert "Plots" not in sweep_note(None, rows) and len(sweep_note(None, rows * 500, plots=("latency.png",), run_id="r")) <= 5000
