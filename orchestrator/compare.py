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

With --remeasure, each variant both sweeps ran is timed again here, baseline and candidate
alternating in short blocks in two fresh processes, until the ratio's interval is within
--target-ci, decides the verdict, or --max-seconds pass; its verdict then rests on those paired rounds, which
a change of the machine's speed between (or during) the sweeps cannot fake. Use it on any
machine you do not control: shared CI runners, VMs, laptops.

    python -m orchestrator.compare A B --remeasure --max-seconds 180
    python -m orchestrator.compare A B --remeasure --cluster 10.0.0.1:6379 --uri http://10.0.0.1:5000

With --cluster, each variant's re-measurement is a Ray task on that cluster, placed as its
benchmark was (a node's bench slot and all its CPUs, or a GPU); its node reads both runs
from the tracking store, which every node must reach (a tracking server).

Where both sweeps measured a variant's quality (bench.quality), a quality column shows its
change, and LOST QUALITY flags a perplexity increase over float32 eager up by more than 1
percentage point (without perplexity: top-1 agreement down by more than 2 points), noted
"not a win" when the variant also got faster.

Exit status: 1 when any variant is slower or lost quality, 0 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from orchestrator.plan.config import TrackingCfg
from orchestrator.read.store import UsageError, open_store, store_uri
from orchestrator.read.verdict_table import compare, ok_runs, pick_sweeps
from orchestrator.run.remeasure import remeasure
from tasks.paired import PairOptions
from tasks.specs import ConfigError


def progress() -> None:
    """The re-measurement's progress lines (orchestrator.common.console.say) on stderr, where
    no Hydra logging config routes them; the table stays alone on stdout."""
    log = logging.getLogger("phasesweep")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


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
    p.add_argument("--remeasure", action="store_true", help="time both sides again here, interleaved")
    p.add_argument("--max-seconds", type=float, default=180.0, help="--remeasure: timed seconds per variant at most")
    p.add_argument("--target-ci", type=float, default=0.01, help="--remeasure: stop once the ratio's 95%% interval is within this")
    p.add_argument("--cluster", default=None, metavar="ADDRESS", help="--remeasure: as Ray tasks on this cluster (host:port, ray://host:port, auto)")
    p.add_argument("--block-calls", type=int, default=4, help="--remeasure: calls per side per round, at least")
    args = p.parse_args(argv)
    try:
        if len(args.sweeps) not in (0, 2):
            raise UsageError("give both BASELINE and CANDIDATE, or neither (the latest two sweeps)")
        if not (args.min_effect > 0 and 0 < args.alpha < 1 and args.resamples > 0):
            raise UsageError("need --min-effect > 0, 0 < --alpha < 1 and --resamples > 0")
        if not (args.max_seconds > 0 and 0 < args.target_ci < 1 and args.block_calls > 0):
            raise UsageError(
                f"need --max-seconds > 0 (got {args.max_seconds:g}), 0 < --target-ci < 1 (got {args.target_ci:g}) "
                f"and --block-calls > 0 (got {args.block_calls})"
            )
        if args.cluster is not None and not args.remeasure:
            raise UsageError(f"--cluster {args.cluster} places the re-measurement: it needs --remeasure")
        client = open_store(args.uri)
        base, cand = pick_sweeps(client, args.sweeps, args.experiment)
    except UsageError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    remeasured = None
    if args.remeasure:
        progress()
        options = PairOptions(
            max_seconds=args.max_seconds, target_ci=args.target_ci, min_effect=args.min_effect, block_calls=args.block_calls
        )
        try:
            remeasured = remeasure(client, ok_runs(client, base), ok_runs(client, cand), options, cluster=args.cluster, uri=store_uri(args.uri))
        except ConfigError as exc:  # the cluster cannot be reached, or offers no bench slot
            print(f"compare: {exc}", file=sys.stderr)
            return 2
    report, text = compare(client, base, cand, args.min_effect, args.alpha, args.resamples, remeasured)
    print(text)
    slower = any(r["verdict"] == "slower" for r in report["variants"])
    return 1 if slower or any(r["lost"] for r in report["quality"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
