"""python -m orchestrator.report REF [--format markdown|csv|html|text] [--out FILE] [--uri URI]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.read.report_build import FORMATS, report
from orchestrator.read.store import UsageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m orchestrator.report",
        description="Rebuild the summary table and plots of an earlier sweep from MLflow alone.",
    )
    ap.add_argument("ref", help="the sweep's run id, an experiment name (its latest sweep), or 'latest'")
    ap.add_argument("--uri", help="tracking URI (default: sqlite:///$PWD/mlflow.db)")
    ap.add_argument("--format", choices=FORMATS, default="markdown")
    ap.add_argument("--out", type=Path, help="write here instead of stdout (markdown: the plots go next to it)")
    args = ap.parse_args(argv)
    try:
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
