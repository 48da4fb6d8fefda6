"""Compare two sweeps variant by variant: ratio of median latencies against reported noise.

    python scripts/compare_sweeps.py                          # the last two sweeps in ./mlflow.db
    python scripts/compare_sweeps.py RUN_ID_A RUN_ID_B --uri sqlite:///path/mlflow.db

Run the same sweep twice and compare: every variant should come out `within noise`
(|median_B / median_A - 1| <= the larger of the two runs' coefficients of variation).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.report import compare_rows, latest_sweeps, sweep_metrics, table  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="parent run ids of two sweeps (default: the latest two)")
    p.add_argument("--uri", default=f"sqlite:///{Path.cwd() / 'mlflow.db'}")
    p.add_argument("--experiment", default="phasesweep")
    args = p.parse_args()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.uri)
    runs = args.runs or latest_sweeps(client, args.experiment)
    if len(runs) != 2:
        raise SystemExit(f"need two sweeps to compare, found {len(runs)}")
    rows = compare_rows(sweep_metrics(client, runs[0]), sweep_metrics(client, runs[1]))
    print(f"A = {runs[0]}\nB = {runs[1]}\n")
    print(table(rows))
    outside = [r["variant"] for r in rows if r["verdict"] != "within noise"]
    print(
        f"\n{len(rows) - len(outside)} of {len(rows)} variants within noise"
        + (f"; outside: {', '.join(outside)}" if outside else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
