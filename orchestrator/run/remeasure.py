"""`compare --remeasure`: each variant two sweeps share, timed again with baseline and
candidate interleaved (tasks/paired.py), on this machine, so that drift between the sweeps
cannot pass for a change.

Each side's benchmark is rebuilt from its run's recorded config.yaml. Its export is the
entry the sweep used (tag export_dir) when that is still here and intact; otherwise it is
made again from the recorded config, with the model itself (.onnx, .pte) fetched from the
tracking store, where the sweep stored it. eager and compile have no artifact: the model is
the recorded config itself.

With a cluster address, each variant's re-measurement is a Ray task asking for what the
variant's benchmark asked (a node's bench slot and all its CPUs, or a GPU): it rebuilds the
pair on that node, from the tracking store, and times it there.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from orchestrator.common.console import say
from orchestrator.plan.config import ConfigError, validate
from orchestrator.plan.planner import bench_spec, export_spec
from orchestrator.plan.variant import Variant


class Unavailable(Exception):
    """Why one side of a variant cannot be measured again here."""


def _variant(client: Any, run: Any) -> Variant:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            text = Path(client.download_artifacts(run.info.run_id, "config.yaml", tmp)).read_text()
        except Exception as e:
            raise Unavailable(f"its run {run.info.run_id} has no readable config.yaml ({e})") from None
    try:
        return Variant.from_point(validate(OmegaConf.create(text)))
    except ConfigError as e:
        raise Unavailable(f"its recorded config no longer validates: {e}") from None


def _entry(client: Any, run: Any, v: Variant, work: Path, timeout_s: float | None) -> str:
    """The export entry to time: the sweep's own when intact here (in this node's cache on a
    cluster), else one made again."""
    from tasks.jobs import export_in_fresh_process
    from tasks.worker.entries import verify_entry, write_manifest
    from tasks.worker.transfer import node_entry

    tags = run.data.tags
    entry = tags.get("export_dir")
    if entry and verify_entry(Path(node_entry(entry))) is None:
        return node_entry(entry)
    stored = tags.get("model_artifact")
    if v.backend.export_format != "none" and not stored:
        why = tags.get("model_not_logged", "the sweep stored no copy of the model")
        raise Unavailable(f"its export {entry} is gone from this machine and {why}")
    out = work / f"{run.info.run_id}"
    result = export_in_fresh_process(export_spec(v, str(out)), timeout_s)
    if not result.ok:
        raise Unavailable(f"its export could not be made again: {result.failure.error}")
    if v.backend.export_format != "none":  # the model as the sweep measured it, not as made now
        import mlflow

        name = Path(result.artifact).name
        for f in out.glob(name + "*"):
            f.unlink()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(mlflow.artifacts.download_artifacts(stored.rsplit("/", 1)[0], dst_path=tmp))
            for f in folder.glob(name + "*"):
                shutil.copy2(f, out / f.name)
        write_manifest(out)
    return str(out)


def pair_spec(client: Any, name: str, runs: dict[str, Any], work: Path, options: Any, timeout_s: float | None) -> Any:
    """The PairSpec of one variant from its baseline and candidate runs ({side: run})."""
    from tasks.paired import PairSpec

    specs = {}
    for side, run in runs.items():
        try:
            v = _variant(client, run)
            specs[side] = bench_spec(name, v, _entry(client, run, v, work / side, timeout_s))
        except Unavailable as e:
            raise Unavailable(f"the {side} side: {e}") from None
    base, cand = specs["baseline"], specs["candidate"]
    if (base.device, base.bench.threads) != (cand.device, cand.bench.threads):
        raise Unavailable(
            f"the sides ran on device={base.device}/{cand.device} with bench.threads={base.bench.threads}/"
            f"{cand.bench.threads}: interleaving them would compare different machines' worth of cores"
        )
    return PairSpec(name, base, cand, options)


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
        from orchestrator.run.remeasure_cluster import on_cluster

        runs = {n: {"baseline": base_runs[n], "candidate": cand_runs[n]} for n in common}
        on_cluster(client, uri, cluster, runs, options, lambda name, i, r: _done(name, i, len(common), r, pairs, missed))
        return pairs, missed
    from tasks.paired import paired_job

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
