"""A bisect's search in MLflow (orchestrator.bisect): one run for the search (its settings,
the ratio at each step as a step metric, the verdict), one child run per commit (or
version, --pip) measured."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.record.store import quick_http, resolve_uri


class BisectRuns:
    def __init__(self, tracking: Any, name: str, params: dict[str, Any], axis: str = "commit"):
        quick_http()
        from mlflow.tracking import MlflowClient  # lazy: mlflow loads once a search starts, not for --help

        self.client = MlflowClient(tracking_uri=resolve_uri(tracking))
        exp = self.client.get_experiment_by_name(tracking.experiment)
        self.experiment = exp.experiment_id if exp else self.client.create_experiment(tracking.experiment)
        run = self.client.create_run(self.experiment, run_name=name, tags={"phasesweep.role": "bisect"})
        self.run_id, self.axis = run.info.run_id, axis  # axis: what the search steps over, "commit" or "version"
        for key, value in params.items():
            self.client.log_param(self.run_id, key, str(value)[:6000])

    def step(self, number: int, sha: str, subject: str, verdict: str, detail: str, ratio: float | None, ci: Any, seconds: float) -> None:
        """Commit `sha` judged `verdict` at step `number` (the first: an end checked)."""
        tags = {
            "mlflow.parentRunId": self.run_id, "phasesweep.role": "bisect_step",
            self.axis: sha, "subject": subject[:500], "verdict": verdict, "detail": detail[:5000],
        }
        child = self.client.create_run(self.experiment, run_name=f"step {number} {sha[:10]}", tags=tags)
        now = int(time.time() * 1000)
        metrics = {"seconds": seconds, **({"ratio": ratio} if ratio is not None else {})}
        if ci is not None:
            metrics.update(ratio_ci_low=ci[0], ratio_ci_high=ci[1])
        for key, value in metrics.items():
            self.client.log_metric(child.info.run_id, key, value, now)
        self.client.set_terminated(child.info.run_id)
        if ratio is not None:
            self.client.log_metric(self.run_id, "ratio", ratio, now, step=number)
        self.client.log_metric(self.run_id, "bad", float(verdict == "bad"), now, step=number)

    def finish(self, verdict: str, first_bad: str | None, suspects: list[str], ok: bool) -> None:
        self.client.set_tag(self.run_id, "verdict", verdict[:5000])
        self.client.set_tag(self.run_id, f"first_bad_{self.axis}", first_bad or "")
        self.client.set_tag(self.run_id, "suspects", " ".join(suspects)[:5000])
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")
