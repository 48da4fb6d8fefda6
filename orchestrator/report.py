"""python -m orchestrator.report REF [--format markdown|csv|html|text] [--out FILE] [--uri URI]
python -m orchestrator.report --history [EXPERIMENT] [--order time|commit] [--format ...] [--out FILE]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.plan.config import TrackingCfg
from orchestrator.read.history import ORDERS
from orchestrator.read.history_report import history_report
from orchestrator.read.report_build import FORMATS, report
from orchestrator.read.store import UsageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m orchestrator.report",
        description="Rebuild the summary table and plots of an earlier sweep from MLflow alone; or, with --history, "
        "each variant's median across the sweeps of an experiment and the sweeps where it changed.",
    )
    ap.add_argument("ref", nargs="?", help="the sweep's run id, an experiment name (its latest sweep), or 'latest'")
    ap.add_argument("--history", nargs="?", const=TrackingCfg().experiment, metavar="EXPERIMENT",
                    help=f"the experiment's history (default {TrackingCfg().experiment!r}); logged on its latest sweep run")  # fmt: skip
    ap.add_argument("--order", choices=ORDERS, default="time", help="--history: sweeps by start time, or by their code's commit date")
    ap.add_argument("--uri", help="tracking URI (default: sqlite:///$PWD/mlflow.db)")
    ap.add_argument("--format", choices=FORMATS, default="markdown")
    ap.add_argument("--out", type=Path, help="write here instead of stdout (markdown: the plots go next to it)")
    args = ap.parse_args(argv)
    try:
        if (args.ref is None) == (args.history is None):
            raise UsageError("give a sweep (REF) or --history [EXPERIMENT], one of the two")
        if args.history is not None:
            text = history_report(args.uri, args.history, args.format, args.out, args.order)
        else:
            text = report(args.uri, args.ref, args.format, args.out)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
