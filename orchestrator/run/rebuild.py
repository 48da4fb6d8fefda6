"""One variant's pair rebuilt from its two runs in the tracking store, for `compare --remeasure`
(orchestrator/run/remeasure.py) here or in a Ray task on a cluster node (entries.remeasure_entry).

Each side's benchmark is rebuilt from its run's recorded config.yaml. Its export is the
entry the sweep used (tag export_dir) when that is still here and intact; otherwise it is
made again from the recorded config, with the model itself (.onnx, .pte) fetched from the
tracking store, where the sweep stored it. eager and compile have no artifact: the model is
the recorded config itself.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from orchestrator.plan.config import ConfigError, validate
from orchestrator.plan.variant import Variant
from orchestrator.plan.work import bench_spec, export_spec
from tasks.jobs import export_in_fresh_process
from tasks.model.hub import local_model
from tasks.paired import PairSpec
from tasks.worker.entries import verify_entry, write_manifest
from tasks.worker.transfer import node_entry


class Unavailable(Exception):
    """Why one side of a variant cannot be measured again here."""


def recorded_variant(client: Any, run: Any) -> Variant:
    """The variant a run measured, from its recorded config.yaml."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            text = Path(client.download_artifacts(run.info.run_id, "config.yaml", tmp)).read_text()
        except Exception as e:
            raise Unavailable(f"its run {run.info.run_id} has no readable config.yaml ({e})") from None
    try:
        return Variant.from_point(validate(OmegaConf.create(text)))
    except ConfigError as e:
        raise Unavailable(f"its recorded config no longer validates: {e}") from None


def _here(spec: Any) -> Any:
    """`spec` with its model's Hugging Face id made this node's snapshot folder (tasks.model.hub)."""
    try:
        return replace(spec, model=local_model(spec.model))
    except (OSError, ValueError) as e:
        raise Unavailable(f"model.checkpoint={spec.model.checkpoint!r} at commit {spec.model.revision}: {e}") from None


def _entry(client: Any, run: Any, v: Variant, work: Path, timeout_s: float | None) -> str:
    """The export entry to time: the sweep's own when intact here (in this node's cache on a
    cluster), else one made again."""
    tags = run.data.tags
    entry = tags.get("export_dir")
    if entry and verify_entry(Path(node_entry(entry))) is None:
        return node_entry(entry)
    stored = tags.get("model_artifact")
    if v.backend.export_format != "none" and not stored:
        why = tags.get("model_not_logged", "the sweep stored no copy of the model")
        raise Unavailable(f"its export {entry} is gone from this machine and {why}")
    out = work / f"{run.info.run_id}"
    spec = export_spec(v, str(out))
    result = export_in_fresh_process(_here(spec), timeout_s)
    if not result.ok:
        raise Unavailable(f"its export could not be made again: {result.failure.error}")
    if v.backend.export_format != "none":  # the model as the sweep measured it, not as made now
        import mlflow  # lazy: mlflow loads when a run starts, not to plan

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
    specs = {}
    for side, run in runs.items():
        try:
            v = recorded_variant(client, run)
            spec = bench_spec(name, v, _entry(client, run, v, work / side, timeout_s))
            specs[side] = _here(spec)
        except Unavailable as e:
            raise Unavailable(f"the {side} side: {e}") from None
    base, cand = specs["baseline"], specs["candidate"]
    if (base.device, base.bench.threads) != (cand.device, cand.bench.threads):
        raise Unavailable(
            f"the sides ran on device={base.device}/{cand.device} with bench.threads={base.bench.threads}/"
            f"{cand.bench.threads}: interleaving them would compare different machines' worth of cores"
        )
    return PairSpec(name, base, cand, options)
