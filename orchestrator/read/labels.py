"""Point labels on a crowded panel: each beside its point where there is room, else further
away with a thin leader line, placed so that no label covers another label, a marker or a
leader line, and no leader line crosses a label, another point's marker or another leader."""

from __future__ import annotations

from typing import Any

# where a point's label may sit, in points from it: beside it, then further above or below, then left
LABEL_OFFSETS = tuple((dx, dy) for dx in (6, -6) for dy in (4, -11, 13, -20, 22, -29, 31, -38, 40, -47))
LEADER_FROM = 2  # offsets from this index on are away from the point: a leader line joins them
MARK_HALF = 4  # half a marker's box, in pixels
Segment = tuple[tuple[float, float], tuple[float, float]]


def place_labels(ax: Any, points: list[tuple[float, float]], texts: list[str], fontsize: float = 8) -> None:
    """Each point's label at the first of LABEL_OFFSETS where it is clear (module docstring) and
    inside the axes; beside the point when no place is. Labels are placed from the rightmost
    point leftwards: a label read rightwards that sits above its right-hand neighbours' then
    leads down past their labels' left ends, not through them. Call once the axes' limits and
    the figure's layout are final: boxes are measured on screen."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    at = [tuple(ax.transData.transform(p)) for p in points]  # each point, in pixels
    marks = [_box(x, y, MARK_HALF) for x, y in at]
    boxes: list[Any] = []
    leaders: list[Segment] = []
    for i in sorted(range(len(points)), key=lambda i: -at[i][0]):
        k, box, leader = _free_offset(ax, renderer, texts[i], points[i], at[i], fontsize, inside, boxes, marks, leaders)
        dx, dy = LABEL_OFFSETS[k]  # a leader starts at the label's corner nearest its point
        relpos = (0.0 if dx > 0 else 1.0, 0.0 if dy > 0 else 1.0)
        lead = {"arrowprops": {"arrowstyle": "-", "color": "0.6", "lw": 0.6, "relpos": relpos}} if leader else {}
        _label(ax, texts[i], points[i], LABEL_OFFSETS[k], fontsize, **lead)
        boxes.append(box)
        if leader:
            leaders.append(leader)


def _free_offset(ax: Any, renderer: Any, text: str, point: tuple[float, float], at: tuple[float, float], fontsize: float,
                 inside: Any, boxes: list[Any], marks: list[Any], leaders: list[Segment]) -> tuple[int, Any, Segment | None]:  # fmt: skip
    """(the index of the first clear offset in LABEL_OFFSETS, or 0; the label's box there; its
    leader line, point to box, or None beside the point)."""
    first = None
    for k, offset in enumerate(LABEL_OFFSETS):
        trial = _label(ax, text, point, offset, fontsize)
        box = trial.get_window_extent(renderer)
        trial.remove()
        leader = (at, _corner(box, offset)) if k >= LEADER_FROM else None
        first = first or (box, leader)
        if _clear(box, leader, inside, boxes, marks, leaders):
            return k, box, leader
    return 0, first[0], None


def _clear(box: Any, leader: Segment | None, inside: Any, labels: list[Any], marks: list[Any], leaders: list[Segment]) -> bool:
    """A label's box inside the axes, over no placed label and no marker and crossed by no
    placed leader line; its own leader line through no placed label, crossing no placed leader.
    (A leader may pass a marker: crowded markers touch, and it starts at one.)"""
    if not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)):
        return False
    if any(box.overlaps(b) for b in [*labels, *marks]) or any(_through(s, box) for s in leaders):
        return False
    return leader is None or not (any(_through(leader, b) for b in labels) or any(_cross(leader, s) for s in leaders))


def _corner(box: Any, offset: tuple[int, int]) -> tuple[float, float]:
    """The corner of a label's box nearest its point, where its leader line starts."""
    return (box.x0 if offset[0] > 0 else box.x1, box.y0 if offset[1] > 0 else box.y1)


def _through(segment: Segment, box: Any, steps: int = 32) -> bool:
    """Whether the segment passes through the box (sampled every 1/steps of its length)."""
    (x0, y0), (x1, y1) = segment
    return any(box.contains(x0 + (x1 - x0) * t / steps, y0 + (y1 - y0) * t / steps) for t in range(1, steps))


def _cross(a: Segment, b: Segment) -> bool:
    """Whether two segments cross (touching ends do not)."""

    def side(p: tuple[float, float], q: tuple[float, float], r: tuple[float, float]) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    (p1, p2), (q1, q2) = a, b
    return side(p1, p2, q1) * side(p1, p2, q2) < 0 and side(q1, q2, p1) * side(q1, q2, p2) < 0


def _label(ax: Any, text: str, point: tuple[float, float], offset: tuple[int, int], fontsize: float, **more: Any) -> Any:
    """`text` at `offset` points from `point`, reading away from it (right of it, or left)."""
    return ax.annotate(text, point, xytext=offset, textcoords="offset points", fontsize=fontsize,
                       ha="left" if offset[0] > 0 else "right", **more)  # fmt: skip


def _box(x: float, y: float, half: float) -> Any:
    from matplotlib.transforms import Bbox  # lazy: matplotlib, only once a plot is drawn

    return Bbox.from_extents(x - half, y - half, x + half, y + half)
