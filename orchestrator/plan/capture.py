"""phase=captured, a stage of the planner (orchestrator/plan/planner.py): each distinct capture
runs on the cluster (on a worker, a CPU bench node whole) before the captured points' variants
are made, and each point then stands for the calls its capture kept (orchestrator/plan/shapes.py).
The application's own figures go on the sweep's run. One capture serves every point of the same
model weights, application and capture options; one that fails ends the sweep before any export."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.common.console import say
from orchestrator.plan.config import SweepPoint
from orchestrator.plan.placement import Capacity, Request, bench_request, bench_threads
from orchestrator.plan.variant import Variant
from tasks.phases.captured import describe, summary
from tasks.specs import CaptureOptions, CaptureResult, CaptureSpec, ConfigError, PhaseSpec

STORE = "captured_inputs"  # the export cache's folder of recorded inputs, one .npz per content digest
MEMORY_FACTOR = 3.0  # the model, the application's own tensors, the caches the capture copies


class Runner(Protocol):
    """Where the captures run: the sweep's cluster (orchestrator.run.scheduler.Scheduler)."""

    def submit(self, kind: str, key: str, spec: Any, request: Request) -> None: ...

    def results(self) -> Iterator[tuple[str, str, Any]]: ...


def wants_capture(phase: PhaseSpec) -> bool:
    """A phase that names an application not yet captured."""
    return phase.app is not None and phase.kind is None


def _key(model: Any, phase: PhaseSpec) -> str:
    # the application runs the float reference (build_model): how its runtimes build it is no part of the capture
    weights = {k: v for k, v in asdict(model).items() if k not in ("name", "kv_cache", "attention", "quant", "quant_group")}
    what = {"model": weights, "app": phase.app, "capture": asdict(phase.capture or CaptureOptions()), "steps": phase.parity_steps}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Captures:
    """The sweep's captures: what each asks for, and once run, what each kept."""

    specs: dict[str, CaptureSpec] = field(default_factory=dict)  # capture key -> spec
    labels: dict[str, str] = field(default_factory=dict)  # capture key -> how the sweep's run names it
    of_point: dict[tuple[int, int], str] = field(default_factory=dict)  # (id(model cfg), id(phase)) -> key
    requests: dict[str, Request] = field(default_factory=dict)
    results: dict[str, CaptureResult] = field(default_factory=dict)
    gaps: dict[str, float | None] = field(default_factory=dict)  # run(): each kept call's gap_ms, by its inputs' file

    @classmethod
    def of(cls, points: Sequence[SweepPoint], variants: Sequence[Variant], capacity: Capacity) -> Captures:
        """One capture per distinct model weights x application x capture options, each on a
        CPU bench node whole; `variants`: each point's, as the planner made them."""
        out = cls()
        apps = {p.phase.app for p in points if wants_capture(p.phase)}
        first: dict[str, tuple[SweepPoint, Variant]] = {}  # capture key -> the first point asking for it
        for point, v in zip(points, variants, strict=True):
            pair = (id(point.model), id(point.phase))
            if not wants_capture(point.phase) or pair in out.of_point:
                continue
            out.of_point[pair] = key = _key(v.model, point.phase)
            if key in first:
                continue
            first[key] = (point, v)
            label = v.model.name if len(apps) == 1 else f"{v.model.name}_{point.phase.app.rpartition(':')[2]}"
            if label in out.labels.values():  # the same model and application, other options
                label = f"{label}_{key[:6]}"
            out.labels[key] = label
        threads = bench_threads(capacity, "cpu", None)
        for key, (point, v) in first.items():
            cluster = point.cluster
            out.specs[key] = CaptureSpec(
                key=key,
                model=v.model,
                app=point.phase.app,
                options=point.phase.capture or CaptureOptions(),
                parity_steps=point.phase.parity_steps,
                store=str(Path(cluster.export_cache).expanduser().resolve() / STORE),
                app_path=os.getcwd(),
                threads=threads,
            )
            out.requests[key] = bench_request(capacity, "cpu", threads, {}, v.weight_bytes, MEMORY_FACTOR, cluster.max_retries)
        return out

    def __bool__(self) -> bool:
        return bool(self.specs)

    def run(self, runner: Runner) -> None:
        """Every capture, on the cluster; raises ConfigError naming each one that failed."""
        for key, spec in self.specs.items():
            say(f"  capturing {spec.app} on {self.labels[key]} ...")
            runner.submit("capture", key, spec, self.requests[key])
        failures = []
        for kind, key, result in runner.results():
            if kind == "retry":
                say(f"  retry     capture of {self.labels[key.partition(':')[2]]}: {result}")
            elif kind == "capture":
                if getattr(result, "ok", False):
                    self.results[key] = result
                    self.say(key)
                else:  # the application's failure, or its process's (a Failure from the scheduler)
                    error = getattr(result, "failure", result).error
                    app = self.specs[key].app
                    failures.append(error if error.startswith("phase.app=") else f"phase.app={app!r} on {self.labels[key]}: {error}")
        if failures:
            raise ConfigError("the capture failed, nothing was exported or recorded:\n  " + "\n  ".join(failures))
        self.gaps = {p.inputs: self.gap_ms(p) for r in self.results.values() for p in r.kept if p.inputs is not None}

    def say(self, key: str) -> None:
        r = self.results[key]
        say(f"  captured  {self.labels[key]}: {describe(r)}")
        for note in r.notes:
            say(f"            not a phase: {note}")
        t = r.timings
        if "app_ttft_ms" in t:
            itl = (
                f", inter-token {t['app_inter_token_ms_median']:.2f} ms median (p90 {t['app_inter_token_ms_p90']:.2f})"
                if "app_inter_token_ms_median" in t
                else ""
            )
            say(
                f"            the application alone ({t['app_runs']:.0f} timed runs): TTFT {t['app_ttft_ms']:.2f} ms"
                f"{itl}, {t['app_outside_forward_share']:.0%} of its loop outside the model's forward"
            )

    def kept(self, point: SweepPoint) -> tuple[PhaseSpec, ...] | None:
        """The calls the capture of a captured point kept, as the application made them (the
        planner normalises them for the point's cache); None for a point that captures nothing."""
        key = self.of_point.get((id(point.model), id(point.phase)))
        return None if key is None else tuple(self.results[key].kept)

    def gap_ms(self, phase: PhaseSpec) -> float | None:
        """A kept call's application's own time between two forwards there, outside them (ms,
        on transformers): for a decode call its inter-token time less its forward near that
        call, for the prompt its time to the first token less the prefill's forward. None for
        any other phase, or a capture that timed no such loop."""
        for r in self.results.values():
            if phase.inputs is None or phase.inputs not in {p.inputs for p in r.kept}:
                continue
            loop, t = r.at_calls.get(phase.call, {}), r.timings
            if phase.context_len is not None:  # a step on a filled cache
                return max(0.0, loop["app_inter_token_ms"] - loop["app_forward_ms"]) if "app_inter_token_ms" in loop else None
            if "app_prefill_forward_ms_median" in t:  # the prompt
                return max(0.0, t["app_ttft_ms"] - t["app_prefill_forward_ms_median"])
        return None

    @staticmethod
    def _variants_of(result: CaptureResult, variants: dict[str, PhaseSpec]) -> dict[str, PhaseSpec]:
        """The variants (name -> phase) of one capture's kept calls: their inputs are its files."""
        inputs = {p.inputs for p in result.kept}
        return {name: ph for name, ph in variants.items() if ph.inputs in inputs}

    # -- the sweep's run ----------------------------------------------------------------------
    def record(self, tracker: Any, parent: str, variants: dict[str, Any]) -> None:
        """Each capture on the sweep's run: the application's timings as metrics
        `{label}.app_*`, the calls seen and kept (captures/{label}.json), the inter-token
        samples; `variants`: variant name -> its phase, to name the kept calls' variants."""
        for key, r in self.results.items():
            label = self.labels[key]
            names = sorted(self._variants_of(r, variants))
            record = {"app": self.specs[key].app, "model": self.specs[key].model.name, **summary(r), "variants": names}
            tracker.log(
                parent,
                metrics={f"{label}.{k}": v for k, v in r.timings.items()},
                params={f"capture.{label}.app": self.specs[key].app, f"capture.{label}.calls": r.total_calls,
                        f"capture.{label}.distinct": len(r.calls), f"capture.{label}.kept": len(r.kept)},
            )
            tracker.log_dict(parent, record, f"captures/{label}.json")
            if r.inter_token_ns:
                samples = {"unit": "ns", "what": "start of one decode forward to the next, every timed run", "samples": r.inter_token_ns}
                tracker.log_dict(parent, samples, f"captures/{label}_inter_token_ns.json", indent=None)

    def beside(self, outcomes: dict[str, Any], variants: dict[str, PhaseSpec]) -> list[dict[str, Any]]:
        """Each measured captured variant beside the application's own loop at that call
        (tasks/phases/_capture.py NEAR): its eager forward there and, for a decode call, the
        time from one token to the next."""
        rows = []
        for key, r in self.results.items():
            for name, ph in sorted(self._variants_of(r, variants).items()):
                o = outcomes.get(name)
                if o is None or "latency_ms_median" not in o.metrics:
                    continue
                loop = r.at_calls.get(ph.call, {})
                rows.append(
                    {
                        "variant": name,
                        **({"capture": self.labels[key]} if len(self.results) > 1 else {}),
                        "call": ph.call,
                        "median_ms": f"{o.metrics['latency_ms_median']:.3f}",
                        **{k: f"{loop[k]:.3f}" if k in loop else "-" for k in ("app_forward_ms", "app_inter_token_ms")},
                    }
                )
        return rows
