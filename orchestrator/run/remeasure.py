"""`compare --remeasure`: each variant two sweeps share, timed again with baseline and
candidate interleaved (tasks/paired.py), on this machine, so that drift between the sweeps
cannot pass for a change.

Each variant's pair is rebuilt from its runs' recorded configs (orchestrator/run/rebuild.py).

With a cluster address, each variant's re-measurement is a Ray task asking for what the
variant's benchmark asked (a node's bench slot and all its CPUs, or a GPU): it rebuilds the
pair on that node, from the tracking store, and times it there.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.common.console import say
from orchestrator.run.rebuild import Unavailable, pair_spec
from orchestrator.run.remeasure_cluster import on_cluster
from tasks.paired import paired_job


def remeasure(
    client: Any,
    base_runs: dict[str, Any],
    cand_runs: dict[str, Any],
    options: Any,
    timeout_s: float | None = None,
    cluster: str | None = None,
    uri: str = "",
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """({variant: its PairResult as a dict}, {variant: why it was not re-measured}) of every
    variant that ended ok in both sweeps: here, or as Ray tasks on the cluster at `cluster`
    (whose nodes read the runs from the tracking store at `uri`)."""
    common = sorted(set(base_runs) & set(cand_runs))
    pairs: dict[str, dict[str, Any]] = {}
    missed: dict[str, str] = {}
    if cluster is not None:
        runs = {n: {"baseline": base_runs[n], "candidate": cand_runs[n]} for n in common}
        on_cluster(client, uri, cluster, runs, options, lambda name, i, r: _done(name, i, len(common), r, pairs, missed))
        return pairs, missed
    with tempfile.TemporaryDirectory(prefix="phasesweep-remeasure-") as tmp:
        for i, name in enumerate(common, 1):
            try:
                spec = pair_spec(client, name, {"baseline": base_runs[name], "candidate": cand_runs[name]}, Path(tmp), options, timeout_s)
            except Unavailable as e:
                _done(name, i, len(common), f"not re-measured: {e}", pairs, missed)
                continue
            say(f"[{i}/{len(common)}] {name}: timing baseline and candidate interleaved ...")
            _done(name, i, len(common), paired_job(spec), pairs, missed)
    return pairs, missed


def _done(name: str, i: int, n: int, result: Any, pairs: dict, missed: dict) -> None:
    """One variant's outcome (a PairResult, or why it was not re-measured) said and kept."""
    if isinstance(result, str):
        missed[name] = result.removeprefix("not re-measured: ")
        say(f"[{i}/{n}] {name}: {result}")
        return
    if not result.ok:
        missed[name] = f"the re-measurement failed: {result.failure.error}"
        say(f"[{i}/{n}] {name}: {missed[name]}")
        return
    pairs[name] = asdict(result)
    low, high = result.ci
    where = f" on node {result.node}" if getattr(result, "node", "") else ""
    say(
        f"[{i}/{n}] {name}: ratio {result.ratio:.3f} [{low:.3f}, {high:.3f}] from "
        f"{len(result.ratios)} rounds in {result.seconds:.0f} s{where} (stopped: {result.stop})"
    )
