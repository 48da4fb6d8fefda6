"""orchestrator.read.plots: each plot is drawn when the sweep has the axes it needs, and only then;
the files are real PNGs. Rows are built by hand, as the sweep (from its outcomes) and the
report (from MLflow runs) build them; no Ray, no MLflow."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from orchestrator.common.outcome import Outcome, Status
from orchestrator.read import draw, labels, plots, trend_plots
from orchestrator.read.plots import plot_rows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def row(model="llama", phase="decode", backend="eager", device="cpu", ctx=None, median=2.0, **metrics):
    name = f"{model}_{phase}_{backend}_{device}" + (f"_ctx{ctx}" if ctx else "")
    m = {
        "latency_ms_median": median,
        "latency_ms_p90": median * 1.1,
        "latency_ms_median_ci_low": median * 0.97,
        "latency_ms_median_ci_high": median * 1.03,
        "tokens_per_s": 2000 / median,
        **metrics,
    }
    return {
        "name": name,
        "model": model,
        "phase": phase,
        "backend": backend,
        "device": device,
        "status": "ok",
        "unstable": False,
        "params": {"phase.context_len": str(ctx or 128)},
        "metrics": m,
    }


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def drawn(rows, tmp_path) -> dict[str, Path]:
    paths = plots.make_plots(rows, tmp_path)
    for p in paths:
        w, h = png_size(p)
        assert w >= 300 and h >= 200 and p.stat().st_size > 5000, f"{p.name}: {w}x{h}, {p.stat().st_size} bytes"
    return {p.relative_to(tmp_path).as_posix(): p for p in paths}


def test_nothing_measured_draws_nothing(tmp_path):
    failed = {**row(), "status": "failed"}
    assert plots.make_plots([], tmp_path) == [] and plots.make_plots([failed], tmp_path) == []
    assert not any(tmp_path.iterdir())


def test_one_variant_gets_only_the_latency_plot(tmp_path):
    assert list(drawn([row(peak_rss_mb=300.0)], tmp_path)) == [plots.LATENCY]  # one memory point says nothing


def test_every_plot_when_the_sweep_has_every_axis(tmp_path):
    rows = [
        row(model=m, backend=b, ctx=c, median=base * c / 64, peak_rss_mb=mem)
        for m, base in (("llama", 1.0), ("phi3", 3.0))
        for b, mem in (("eager", 900.0), ("onnxruntime", 300.0))
        for c in (64, 256, 1024)
    ]
    rows += [row(phase="prefill", backend="onnxruntime", median=40.0, peak_rss_mb=350.0)]
    rows[0]["unstable"] = True
    out = drawn(rows, tmp_path)
    assert list(out) == [plots.LATENCY, plots.CONTEXT, plots.SPEEDUP, plots.MEMORY]


def test_context_plot_needs_two_context_lengths_among_decode_variants(tmp_path):
    one_ctx = [row(backend=b, ctx=64) for b in ("eager", "onnxruntime")]
    assert plots.CONTEXT not in drawn(one_ctx, tmp_path / "a")
    # prefill has no context length (its phase module normalises it away): never on that plot
    prefill = [row(phase="prefill", backend=b) for b in ("eager", "onnxruntime")]
    assert plots.CONTEXT not in drawn(prefill, tmp_path / "b")
    two = [row(backend="onnxruntime", ctx=c) for c in (64, 256)]
    assert plots.CONTEXT in drawn(two, tmp_path / "c")
    assert list(trend_plots.context_rows(two + prefill)) == ["llama"]


def test_speedup_needs_eager_and_another_backend_of_the_same_model_and_phase(tmp_path):
    no_eager = [row(backend="onnxruntime"), row(backend="executorch")]
    assert plots.SPEEDUP not in drawn(no_eager, tmp_path / "a")
    eager_only = [row(backend="eager"), row(backend="eager", model="phi3")]
    assert plots.SPEEDUP not in drawn(eager_only, tmp_path / "b")
    apart = [row(backend="eager"), row(backend="onnxruntime", phase="prefill")]  # not the same phase
    assert plots.SPEEDUP not in drawn(apart, tmp_path / "c")
    both = [
        row(backend="eager", median=4.0),
        row(backend="onnxruntime", median=1.0),
        row(backend="compile", median=8.0),
    ]
    assert plots.SPEEDUP in drawn(both, tmp_path / "d")
    labels, backends, cells = trend_plots.speedups(both)
    assert labels == ["llama · decode"] and backends == ["compile", "onnxruntime"]
    assert cells == {("llama · decode", "onnxruntime"): 4.0, ("llama · decode", "compile"): 0.5}


def test_speedup_compares_variants_that_differ_only_in_backend(tmp_path):
    rows = [
        row(backend=b, ctx=c, median=m)
        for b, c, m in (("eager", 64, 2.0), ("eager", 256, 6.0), ("onnxruntime", 64, 1.0))
    ]
    labels, _, cells = trend_plots.speedups(rows)
    assert labels == ["llama · decode ctx64"] and cells == {("llama · decode ctx64", "onnxruntime"): 2.0}


def test_memory_plot_needs_two_variants_with_memory_and_reads_cuda_memory_on_cuda(tmp_path):
    assert plots.MEMORY not in drawn([row(backend="eager"), row(backend="onnxruntime")], tmp_path / "a")
    cuda = [
        row(backend=b, device="cuda", peak_rss_mb=5000.0, cuda_peak_allocated_mb=m)
        for b, m in (("eager", 40.0), ("compile", 60.0))
    ]
    assert plots.MEMORY in drawn(cuda, tmp_path / "b")
    assert {k: [mb for _, mb in v] for k, v in trend_plots.memory_points(cuda).items()} == {
        "cuda_peak_allocated_mb": [40.0, 60.0]
    }


def test_latency_plot_without_ci_or_p90_and_with_many_panels(tmp_path):
    rows = [
        row(model=m, phase=p, backend=b)
        for m in ("llama", "phi3")
        for p in ("prefill", "decode")
        for b in ("eager", "onnxruntime")
    ]
    rows.append(row(model="qwen"))
    for r in rows[:3]:
        for k in ("latency_ms_p90", "latency_ms_median_ci_low", "latency_ms_median_ci_high"):
            del r["metrics"][k]
    assert list(drawn(rows, tmp_path)) == [plots.LATENCY, plots.SPEEDUP]


def test_rows_from_outcomes(tmp_path):
    ok = Outcome(
        "llama_decode_eager_cpu",
        Status.OK,
        "r1",
        {"model": "llama", "phase": "decode", "backend": "eager", "device": "cpu"},
    )
    ok.metrics = {"latency_ms_median": 1.0, "latency_ms_p90": 1.2}
    failed = Outcome("llama_decode_onnxruntime_cpu", Status.FAILED, "r2", {**ok.axes, "backend": "onnxruntime"})
    rows = plot_rows([ok, failed], {ok.name: {"phase.context_len": 64, "model.dtype": "float32"}})
    assert rows[0]["params"] == {"phase.context_len": "64"} and rows[0]["status"] == "ok"
    assert [r["name"] for r in plots.measured(rows)] == [ok.name]
    assert plots.make_plots(rows, tmp_path) == [tmp_path / plots.LATENCY] and png_size(tmp_path / plots.LATENCY)
    assert plots.make_plots(rows[1:], tmp_path / "none") == [] and not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    "name, expected", [("llama_decode_eager_cpu", ""), ("llama_decode_eager_cpu_ctx64_bf16", "ctx64_bf16")]
)
def test_suffix_is_what_the_name_says_beyond_the_four_axes(name, expected):
    assert draw.suffix({**row(), "name": name}) == expected


def quality_row(backend, suffix, median, ppl_increase=None, kl=1e-4, top1=0.99, phase="decode", model="tiny"):
    r = row(model=model, phase=phase, backend=backend, median=median, quality_kl=kl, quality_top1=top1)
    r["name"] += f"_{suffix}" if suffix else ""
    if ppl_increase is not None:
        r["metrics"].update(quality_ppl_increase=ppl_increase, quality_ppl=10 * (1 + ppl_increase), quality_ppl_ref=10.0)
    return r


def test_speed_vs_quality_is_drawn_only_with_quality(tmp_path):
    assert plots.QUALITY not in drawn([row()], tmp_path)
    rows = [
        quality_row("eager", "", 2.0, 0.0, kl=1e-12, top1=1.0),
        quality_row("onnxruntime", "", 1.0, 0.0, kl=1e-11, top1=1.0),
        quality_row("onnxruntime", "int8", 0.6, 0.004),
        quality_row("executorch", "int4", 0.4, 0.06, kl=3e-2, top1=0.9),
        quality_row("executorch", "int8", 0.7, 0.01),  # slower and worse than onnxruntime int8: off the front
        quality_row("eager", "", 3.0, None, kl=1e-12, top1=1.0, phase="prefill", model="llama"),  # random weights: KL
        quality_row("onnxruntime", "fp16", 2.0, None, kl=2e-5, phase="prefill", model="llama"),
    ]
    assert plots.QUALITY in drawn(rows, tmp_path)


def test_a_float32_reference_is_drawn_at_no_change_beside_what_was_measured(tmp_path):
    """quality_reference rows (measured nothing: the reference itself) join a panel that measured
    something, at no change; alone they draw no plot."""
    from orchestrator.read.quality_plot import _panels, _y

    ref = row(model="tiny", phase="decode", backend="onnxruntime", median=1.0, quality_reference=1.0)
    int8 = quality_row("onnxruntime", "int8", 0.6, 0.004)
    other = row(model="other", phase="decode", backend="eager", median=2.0, quality_reference=1.0)
    assert plots.QUALITY not in drawn([ref, other], tmp_path / "refs")
    panels = _panels([ref, int8, other])
    assert list(panels) == [("tiny", "decode")] and panels[("tiny", "decode")] == [ref, int8]
    assert _y(ref["metrics"], True) == 0.0 and _y(ref["metrics"], False) == 1e-9
    assert plots.QUALITY in drawn([ref, int8, other], tmp_path)


def test_pareto_front_keeps_what_nothing_beats_on_both():
    from orchestrator.read.quality_plot import pareto

    points = [(2.0, 0.0), (1.0, 0.0), (0.6, 0.4), (0.4, 6.0), (0.7, 1.0), (0.5, 6.5)]
    assert pareto(points) == [3, 2, 1]  # by latency; (2.0, 0.0) is tied on quality and slower


def _through(a, b, box, steps=64):
    return any(box.contains(a[0] + (b[0] - a[0]) * t / steps, a[1] + (b[1] - a[1]) * t / steps) for t in range(1, steps))


def _side(p, q, r):
    return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])


def _cross(a, b):
    """Checked here on its own, not with the placement's geometry it checks."""
    return _side(*a, b[0]) * _side(*a, b[1]) < 0 and _side(*b, a[0]) * _side(*b, a[1]) < 0


@pytest.mark.parametrize(
    "points",
    [
        [(0.05, 1e-9), (0.052, 1e-9), (0.055, 1e-9), (0.2, 1e-9), (0.205, 1e-9), (0.1, 1e-2)],
        # two rows of references crowded at the floor, as on a sweep of several runtimes
        [(0.05, 1e-9), (0.052, 1e-9), (0.055, 1e-9), (0.057, 1e-9), (0.06, 1e-9), (0.2, 1e-9), (0.205, 1e-9), (0.1, 1e-2), (0.21, 1e-9)],
    ],
)
def test_labels_of_close_points_are_placed_apart_inside_the_axes(points):
    """Points crowded at the floor of a log axis, as float32 references of one model and phase
    are on the speed-quality plot: each label in the axes, none over another or a marker, and
    no leader line through another label or across another leader."""
    plt = draw.pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    ax.plot(*zip(*points, strict=True), "o")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.03, 0.4)
    ax.set_ylim(5e-10, 1)
    fig.tight_layout()
    labels.place_labels(ax, points, [f"backend{i} (reference)" for i in range(len(points))])
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text alone, not its leader line
    inside = ax.get_window_extent(renderer)
    assert len(boxes) == len(points)
    marks = [ax.transData.transform(p) for p in points]
    for i, box in enumerate(boxes):
        name = ax.texts[i].get_text()
        assert inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1), name
        assert not any(box.overlaps(other) for other in boxes[i + 1 :]), name
        assert not any(box.contains(*m) for m in marks), name
    leaders = {}  # text index -> its leader line, in pixels
    for i, t in enumerate(ax.texts):
        if t.arrow_patch is not None:
            ends = t.arrow_patch.get_transform().transform(t.arrow_patch.get_path().vertices)
            leaders[i] = (tuple(ends[0]), tuple(ends[-1]))
    assert leaders  # the crowd needs some
    for i, (a, b) in leaders.items():
        others = [box for j, box in enumerate(boxes) if j != i]
        assert not any(_through(a, b, box) for box in others), f"{ax.texts[i].get_text()}'s leader crosses a label"
        assert not any(_cross((a, b), leaders[j]) for j in leaders if j > i), f"{ax.texts[i].get_text()}'s leader crosses another"
    plt.close(fig)


def test_the_memory_plot_colours_no_backend_red_which_marks_unstable(tmp_path, monkeypatch):
    backends = ["eager", "compile", "onnxruntime", "executorch", "llamacpp", "openvino"]
    rows = [row(backend=b, median=1.0 + i, peak_rss_mb=100.0 + 10 * i) for i, b in enumerate(backends)]
    seen = []
    axes_class = draw.pyplot().Axes
    real_scatter = axes_class.scatter

    def scatter(self, *args, **kwargs):
        seen.append(kwargs["color"])
        return real_scatter(self, *args, **kwargs)

    monkeypatch.setattr(axes_class, "scatter", scatter)
    assert trend_plots.memory_plot(rows, tmp_path / "memory.png")
    assert len(seen) == len(backends) and set(seen) <= set(draw.PALETTE)
