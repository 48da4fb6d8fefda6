"""The driver's console output: one line at a time through the "phasesweep" logger, and
plain-text tables."""

from __future__ import annotations

import logging
from typing import Any

RIGHT = {"median_ms", "p90_ms", "tokens_per_s", "app_forward_ms", "app_inter_token_ms"}  # right-aligned columns


def say(msg: str) -> None:
    """One line of output; conf/hydra/job_logging/phasesweep.yaml prints it and logs it to a file."""
    logging.getLogger("phasesweep").info(msg)


def fold(text: str, width: int = 120) -> str:
    """The first line of a message, cut at `width`."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 3] + "..."


def table(rows: list[dict[str, Any]]) -> str:
    """Rows of equal keys as aligned text columns."""
    if not rows:
        return "(no variants)"
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}

    def line(r: dict[str, Any]) -> str:
        return "  ".join(str(r[c]).rjust(width[c]) if c in RIGHT else str(r[c]).ljust(width[c]) for c in cols).rstrip()

    return "\n".join([line({c: c for c in cols}), "  ".join("-" * width[c] for c in cols), *map(line, rows)])
