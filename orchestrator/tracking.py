"""MLflow: one parent run per sweep invocation, one child run per variant, batched logging.

The driver owns every run's life: a child run is created when its variant is planned and
ended with its final status here, because a worker that died cannot report its own death.
mlflow is imported lazily so `python sweep.py --help` stays instant.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.config import TrackingCfg

MAX_PARAMS, MAX_METRICS, MAX_TAG = 100, 1000, 5000  # MLflow's per-batch and per-value limits


def resolve_uri(cfg: TrackingCfg) -> str:
    return cfg.uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def ui_command(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}"


class Tracker:
    def __init__(self, cfg: TrackingCfg):
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(cfg)
        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            location = None
            if not self.uri.startswith(("http://", "https://")):
                root = Path(cfg.artifact_root or Path.cwd() / "mlartifacts").expanduser().resolve()
                location = root.as_uri()
            self.experiment_id = self.client.create_experiment(cfg.experiment, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id

    # -- low level -------------------------------------------------------------------
    def log(
        self,
        run_id: str,
        metrics: dict[str, float] | None = None,
        params: dict[str, Any] | None = None,
        tags: dict[str, Any] | None = None,
    ) -> None:
        """Everything in as few calls as MLflow's batch limits allow."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        m = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
        p = [Param(k, str(v)[:MAX_TAG]) for k, v in (params or {}).items()]
        t = [RunTag(k, str(v)[:MAX_TAG]) for k, v in (tags or {}).items()]
        while m or p or t:
            self.client.log_batch(run_id, metrics=m[:MAX_METRICS], params=p[:MAX_PARAMS], tags=t[:MAX_PARAMS])
            m, p, t = m[MAX_METRICS:], p[MAX_PARAMS:], t[MAX_PARAMS:]

    def artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)

    # -- the sweep's runs ----------------------------------------------------------------
    def start_sweep(self, name: str, params: dict[str, Any], tags: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=name, tags={"phasesweep.role": "sweep"})
        self.log(run.info.run_id, params=params, tags=tags)
        return run.info.run_id

    def start_variant(
        self, parent: str, name: str, tags: dict[str, Any], params: dict[str, Any], config_yaml: str
    ) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={"mlflow.parentRunId": parent, "phasesweep.role": "variant", "variant": name},
        )
        run_id = run.info.run_id
        self.log(run_id, params=params, tags=tags)
        self.log_text(run_id, config_yaml, "config.yaml")
        return run_id

    def log_dict(self, run_id: str, obj: Any, name: str, indent: int | None = 1) -> None:
        self.client.log_text(run_id, json.dumps(obj, indent=indent, default=str), name)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def log_failure(self, run_id: str, stage: str, error: str, traceback: str) -> None:
        self.log(run_id, tags={"status": "failed", "failure_stage": stage, "error": error})
        if traceback:
            self.log_text(run_id, traceback, "error.txt")
