"""The GPU check's measuring layer alone: tasks/ (export, parity, timed loop, CUDA events, peak
memory, bandwidth) on a machine where the orchestrator's packages (Ray, MLflow, Hydra) cannot be
installed, such as a lent GPU machine with no package registry. Same variants and settings as
scripts/gpu_check.sh's sweep; each export and benchmark runs in a fresh process, as a sweep's do.

    python scripts/gpu_check_tasks.py --out DIR [--dtypes bfloat16,float16] [--size 1b]
        [--device cuda] [--deadline-s 420] [--context-len 1024] [--prompt-len 128]

Prints one row per variant and writes DIR/gpu_table.txt and DIR/gpu_results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks.jobs import bench_in_fresh_process, export_in_fresh_process  # noqa: E402
from tasks.specs import BenchOptions, BenchSpec, ExportSpec, ModelSpec, PhaseSpec, resolve_attention  # noqa: E402

BACKENDS = {"eager": "none", "compile": "none", "onnxruntime": "onnx"}  # backend -> export format
COLS = [  # header, metric, format
    ("median_ms", "latency_ms_median", "{:.3f}"),
    ("tokens_per_s", "tokens_per_s", "{:.1f}"),
    ("achieved_bandwidth_gbs", "achieved_bandwidth_gbs", "{:.1f}"),
    ("bandwidth_fraction_of_peak", "bandwidth_fraction_of_peak", "{:.3f}"),
    ("cuda_peak_allocated_mb", "cuda_peak_allocated_mb", "{:.0f}"),
    ("parity_max_abs_diff", "parity_max_abs_diff", "{:.3g}"),
]


def model(size: str, dtype: str) -> ModelSpec:
    """conf/model/llama.yaml's preset at `size`, as the planner builds it."""
    cfg = yaml.safe_load((ROOT / "conf" / "model" / "llama.yaml").read_text())
    fields = {k: cfg[k] for k in ("name", "family", "seed", "kv_cache")}
    attention = resolve_attention(cfg["kv_cache"], cfg["attention"])
    return ModelSpec(size=size, arch=dict(cfg["sizes"][size]), dtype=dtype, attention=attention, **fields)


def ort_on_cuda() -> bool:
    """Whether this ONNX Runtime has a CUDA provider at all (PyPI's onnxruntime has none)."""
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def row(name: str, result) -> list[str]:
    m = result.metrics if result is not None else {}
    cells = [name] + [fmt.format(m[key]) if key in m else "-" for _, key, fmt in COLS]
    status = "ok" if result is not None and result.ok else "failed" if result is not None else "not run"
    return cells + [status]


def table(rows: list[list[str]]) -> str:
    heads = ["variant"] + [h for h, _, _ in COLS] + ["status"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths, strict=True)))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/phasesweep_gpu_check/tasks")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--size", default="1b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=1024)
    ap.add_argument("--deadline-s", type=float, default=420.0)
    args = ap.parse_args()
    start, out, work = time.monotonic(), Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    backends = [b for b in BACKENDS if b != "onnxruntime" or args.device != "cuda" or ort_on_cuda()]
    if "onnxruntime" not in backends:
        print("!! onnxruntime has no CUDAExecutionProvider here: its variants are left out", flush=True)
    bench = BenchOptions(warmup_max_seconds=2, min_seconds=1, max_seconds=4, threads=1, quality=False)
    phases = {
        "prefill": PhaseSpec("prefill", batch=1, prompt_len=args.prompt_len),
        "decode": PhaseSpec("decode", batch=1, context_len=args.context_len),
    }
    rows, results = [], {}
    for dtype in args.dtypes.split(","):
        spec = model(args.size, dtype)
        for phase_name, phase in phases.items():
            for backend in backends:
                name = f"llama-{args.size}-{dtype}_{phase_name}_{backend}_{args.device}"
                left = args.deadline_s - (time.monotonic() - start)
                if left < 20:
                    rows.append(row(name, None))
                    continue
                fmt = BACKENDS[backend]
                key = f"{args.size}-{dtype}-{phase_name}-{fmt}"
                export = export_in_fresh_process(ExportSpec(key, spec, phase, fmt, str(work / key)), timeout_s=left)
                if not export.ok:
                    print(f"!! {name}: export failed: {export.failure.error[:300]}", flush=True)
                    rows.append(row(name, None))
                    continue
                left = args.deadline_s - (time.monotonic() - start)
                b = BenchSpec(name, backend, args.device, spec, phase, export.out_dir, bench)
                result = bench_in_fresh_process(b, timeout_s=max(left, 10))
                if not result.ok:
                    print(f"!! {name}: {result.failure.stage}: {result.failure.error[:300]}", flush=True)
                results[name] = {"metrics": result.metrics, "params": result.params, "env": result.env,
                                 "failure": asdict(result.failure) if result.failure else None}
                rows.append(row(name, result))
                print("  ".join(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    (out / "gpu_table.txt").write_text(text + "\n")
    (out / "gpu_results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r[-1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
