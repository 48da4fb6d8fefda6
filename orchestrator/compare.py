"""Did it get slower? Two sweeps compared variant by variant on their raw latency samples.

    python -m orchestrator.compare                         # the latest two sweeps of ./mlflow.db
    python -m orchestrator.compare BASELINE CANDIDATE      # sweep run ids, experiment names, or latest
    python -m orchestrator.compare A B --min-effect 0.05 --alpha 0.05 --uri sqlite:///x/mlflow.db

Per variant that ended ok in both: the ratio of medians candidate / baseline, its 95%
block-bootstrap interval and a Mann-Whitney U p-value of the runs' block medians (20
contiguous blocks per run), Holm-corrected across the variants.

    slower        the whole interval lies above 1 + min_effect, and the corrected p < alpha
    faster        the whole interval lies below 1 - min_effect, and the corrected p < alpha
    same          the whole interval lies within [1 - min_effect, 1 + min_effect]
    inconclusive  anything else: measure more, or accept a coarser min_effect

A variant measured on shared cores, or whose machine-speed probes differ by more than
min_effect, is called slower or faster only beyond 50% and beyond the machine's own change;
the table says why. Below it: what changed inside each variant's artifact.

Exit status: 1 when any variant is slower, 0 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from orchestrator.plan.config import TrackingCfg
from orchestrator.read.compare import compare, pick_sweeps
from orchestrator.read.store import UsageError, open_store


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("sweeps", nargs="*", metavar="BASELINE CANDIDATE", help="sweep run ids or experiment names")
    p.add_argument("--uri", default=None, help="MLflow tracking URI (default: sqlite:///$PWD/mlflow.db)")
    p.add_argument("--experiment", default=TrackingCfg().experiment, help="where to find the latest two sweeps")
    p.add_argument("--min-effect", type=float, default=0.05, help="smallest relative change that matters")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level after the Holm correction")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples per variant")
    args = p.parse_args(argv)
    try:
        if len(args.sweeps) not in (0, 2):
            raise UsageError("give both BASELINE and CANDIDATE, or neither (the latest two sweeps)")
        if not (args.min_effect > 0 and 0 < args.alpha < 1 and args.resamples > 0):
            raise UsageError("need --min-effect > 0, 0 < --alpha < 1 and --resamples > 0")
        client = open_store(args.uri)
        base, cand = pick_sweeps(client, args.sweeps, args.experiment)
    except UsageError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    report, text = compare(client, base, cand, args.min_effect, args.alpha, args.resamples)
    print(text)
    return 1 if any(r["verdict"] == "slower" for r in report["variants"]) else 0


if __name__ == "__main__":
    sys.exit(main())
