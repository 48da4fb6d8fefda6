#!/usr/bin/env bash
# One prepared GPU check, at most 8 minutes on one GPU: every CUDA path of phasesweep on the
# Llama-3.2-1B architecture (random weights), bf16 and fp16, prefill and decode, backends
# eager, compile (torch.compile/inductor) and onnxruntime (CUDA execution provider with
# IOBinding), device=cuda: 12 variants in ONE sweep. The code already reports CUDA-event
# latencies, CUDA peak memory (cuda_peak_allocated_mb) and decode's bandwidth
# (achieved_bandwidth_gbs, bandwidth_fraction_of_peak); this script prints them as a table.
#
#   scripts/gpu_check.sh                 # the whole check; results in ${OUT:-./gpu_check_out}
#   scripts/gpu_check.sh --table DB      # only print the table of the latest sweep in sqlite DB
#
# Steps: a venv if none (.venv; onnxruntime swapped for onnxruntime-gpu of the pinned
# version, since PyPI's onnxruntime is CPU-only), nvidia-smi, a CPU preflight (exports and
# their eager references run on the CPU in the model's dtype; a CPU without native bf16/fp16
# matrix kernels would take far longer than the budget, so a dtype it cannot export in time
# is left out, with a line saying so), the sweep (stopped with Ctrl-C semantics at the
# deadline, so every variant is still recorded), then the table.
# Out (a device tool collects $OUT): gpu_check.log, gpu_table.txt, gpu.db (MLflow sqlite).
# Env: OUT, GPU_CHECK_SECONDS (480: the whole script's budget), GPU_CHECK_WORK (exports,
# artifacts, Hydra's folders: /tmp/phasesweep_gpu_check), DTYPES (bfloat16,float16),
# CONTEXT_LEN (1024), PROMPT_LEN (128), SKIP_PREFLIGHT=1, PYTHON (the interpreter that
# makes the venv; the project needs Python 3.11), PHASESWEEP_PY (an interpreter with the
# project's packages already installed: no venv is made and no package is touched).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)

# -- the table printer (also runnable alone: --table DB) -----------------------------------
print_table() {  # $1: sqlite file; prints the variants of the latest sweep in it
    "$PY" - "$1" <<'PYEOF'
import os
import sys

os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
from mlflow.tracking import MlflowClient

db = os.path.abspath(sys.argv[1])
if not os.path.isfile(db):
    sys.exit(f"no tracking database at {db}")
client = MlflowClient(tracking_uri=f"sqlite:///{db}")
exps = client.search_experiments()
ids = [e.experiment_id for e in exps]
sweeps = client.search_runs(ids, "tags.`phasesweep.role` = 'sweep'", order_by=["attributes.start_time DESC"], max_results=1)
if not sweeps:
    sys.exit(f"no phasesweep sweep recorded in {db}")
sweep = sweeps[0]
runs = client.search_runs(ids, f"tags.`mlflow.parentRunId` = '{sweep.info.run_id}'", max_results=1000)
runs.sort(key=lambda r: r.info.run_name or "")

COLS = [  # header, metric (None: from tags), format
    ("variant", None, None),
    ("median_ms", "latency_ms_median", "{:.3f}"),
    ("tokens_per_s", "tokens_per_s", "{:.1f}"),
    ("achieved_bandwidth_gbs", "achieved_bandwidth_gbs", "{:.1f}"),
    ("bandwidth_fraction_of_peak", "bandwidth_fraction_of_peak", "{:.3f}"),
    ("cuda_peak_allocated_mb", "cuda_peak_allocated_mb", "{:.0f}"),
    ("parity_max_abs_diff", "parity_max_abs_diff", "{:.3g}"),
    ("status", None, None),
]
rows = []
for r in runs:
    m, tags = r.data.metrics, r.data.tags
    row = []
    for head, key, fmt in COLS:
        if head == "variant":
            row.append(r.info.run_name or tags.get("variant", "?"))
        elif head == "status":
            row.append(tags.get("status", r.info.status.lower()))
        else:
            row.append(fmt.format(m[key]) if key in m else "-")
    rows.append(row)
widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, (h, _, _) in enumerate(COLS)]
print(f"sweep {sweep.info.run_name} ({len(runs)} variants) in {db}")
print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, ((h, _, _), w) in enumerate(zip(COLS, widths))))
for row in rows:
    print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))

notes = []
for r in runs:
    m, p, tags, name = r.data.metrics, r.data.params, r.data.tags, r.info.run_name
    if tags.get("status") not in (None, "ok"):
        why = tags.get("skip_reason") or tags.get("error") or ""
        stage = tags.get("failure_stage")
        notes.append(f"{name}: {tags.get('status')}{f' at {stage}' if stage else ''}: {why[:300]}")
    providers = p.get("runtime.ort_providers", p.get("ort_providers"))
    if tags.get("device") == "cuda" and providers is not None and "CUDAExecutionProvider" not in providers:
        notes.append(f"{name}: ONNX Runtime ran on {providers}, NOT on CUDA: its numbers are not the GPU's")
    if "compile_seconds" in m:
        notes.append(f"{name}: compile_seconds {m['compile_seconds']:.1f}")
for n in notes:
    print("  " + n)
PYEOF
}

if [[ "${1:-}" == "--table" ]]; then
    PY=${PY:-$ROOT/.venv/bin/python}
    print_table "${2:?usage: scripts/gpu_check.sh --table path/to/gpu.db}"
    exit $?
fi

BUDGET=${GPU_CHECK_SECONDS:-480}
OUT_DIR=${OUT:-./gpu_check_out}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=${GPU_CHECK_WORK:-/tmp/phasesweep_gpu_check}
mkdir -p "$WORK"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
echo "== phasesweep GPU check, $(date -u +%FT%TZ), budget ${BUDGET}s, out $OUT_DIR, work $WORK"

# -- the environment -----------------------------------------------------------------------
if [[ -n "${PHASESWEEP_PY:-}" ]]; then  # an interpreter prepared elsewhere: its packages are left alone
    PY=$PHASESWEEP_PY
    echo "== using PHASESWEEP_PY=$PY as it is"
else
    PY=$ROOT/.venv/bin/python
    if [[ ! -x "$PY" ]]; then
        BOOT=${PYTHON:-$(command -v python3.11 || command -v python3)}
        echo "== no .venv: creating one with $BOOT and installing the project (pip install -e .)"
        if ! { "$BOOT" -m venv .venv && "$PY" -m pip install -q -e .; }; then
            echo "!! venv/install failed (no package registry?): measuring with $BOOT's own packages"
            rm -rf .venv
            PY=$BOOT
        fi
    fi
    # PyPI's onnxruntime has the CPU provider only: swap it for onnxruntime-gpu of the version
    # pyproject pins (both install the same module, so the CPU one goes first)
    if ! "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
        ORT_VERSION=$(sed -n 's/.*"onnxruntime==\([^"]*\)".*/\1/p' pyproject.toml)
        echo "== swapping onnxruntime for onnxruntime-gpu==$ORT_VERSION (PyPI's onnxruntime is CPU-only)"
        "$PY" -m pip uninstall -y -q onnxruntime onnxruntime-gpu
        "$PY" -m pip install -q "onnxruntime-gpu==$ORT_VERSION" || echo "!! could not install onnxruntime-gpu==$ORT_VERSION"
    fi
fi
# A provider that is listed can still fail to load (CUDA/cuDNN libraries of another major
# version): then ONNX Runtime falls back to the CPU silently. So run a one-node model.
"$PY" - <<'PYEOF'
import onnxruntime as ort

avail = ort.get_available_providers()
if "CUDAExecutionProvider" not in avail:
    print(f"!! ONNX Runtime {ort.__version__}: CUDAExecutionProvider NOT available ({', '.join(avail)}): "
          "the onnxruntime variants will fail")
else:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "check", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        used = s.get_providers()
    except Exception as e:  # noqa: BLE001
        used = [f"error: {e}"]
    ok = "CUDAExecutionProvider" in used
    print(f"{'==' if ok else '!!'} ONNX Runtime {ort.__version__}: CUDAExecutionProvider "
          f"{'loads' if ok else 'is listed but does NOT load'} (a session used: {', '.join(used)})")
PYEOF
echo "== nvidia-smi"
nvidia-smi || echo "!! nvidia-smi failed"
"$PY" -c "import torch; print('== torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

# -- preflight: can this CPU build the exports in time? ------------------------------------
# Every export builds the model and runs its eager reference ON THE CPU, in the model's dtype,
# one thread each (Ray gives an export task one CPU): decode's reference runs the whole
# context (CONTEXT_LEN tokens) through the 1.2B-parameter model, ~2.5 TFLOP at 1024. A CPU
# without native bf16/fp16 matrix kernels runs those at well under 1 GFLOP/s: a dtype whose
# estimated reference time exceeds REF_BUDGET is left out rather than stall the whole check.
DTYPES=${DTYPES:-bfloat16,float16}
CONTEXT_LEN=${CONTEXT_LEN:-1024}
PROMPT_LEN=${PROMPT_LEN:-128}
REF_BUDGET=${REF_BUDGET:-120}
if [[ "${SKIP_PREFLIGHT:-0}" != 1 ]]; then
    DTYPES=$(OMP_NUM_THREADS=1 "$PY" - "$DTYPES" "$CONTEXT_LEN" "$REF_BUDGET" <<'PYEOF'
import sys
import time

import torch

torch.set_num_threads(1)
dtypes, ctx, budget = sys.argv[1].split(","), int(sys.argv[2]), float(sys.argv[3])
flop_needed = 2 * 1.24e9 * (ctx + 8)  # decode reference: context + parity steps through 1.24B parameters
keep = []
for name in dtypes:
    dt = getattr(torch, name)
    a, b = torch.randn(64, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
    a @ b
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.5:
        a @ b
        n += 1
    gflops = 2 * 64 * 1024 * 1024 * n / (time.perf_counter() - t0) / 1e9
    est = flop_needed / (gflops * 1e9)
    ok = est <= budget
    print(f"{'==' if ok else '!!'} CPU {name} matmul, 1 thread: {gflops:.1f} GFLOP/s; a decode export's reference "
          f"(context {ctx}) would take ~{est:.0f} s: {'kept' if ok else f'LEFT OUT (over {budget:.0f} s)'}", file=sys.stderr)
    if ok:
        keep.append(name)
print(",".join(keep))
PYEOF
    )
    if [[ -z "$DTYPES" ]]; then
        echo "!! no dtype can be exported on this CPU within the budget (set SKIP_PREFLIGHT=1 to try anyway)"
        exit 1
    fi
fi

# -- without the orchestrator's packages: the measuring layer alone ------------------------
# A machine with no package registry (a lent GPU machine) may hold torch but not Ray, MLflow or
# Hydra: then the same variants run through tasks/ directly (scripts/gpu_check_tasks.py).
if ! "$PY" -c "import ray, mlflow, hydra" 2>/dev/null; then
    LEFT=$((BUDGET - SECONDS - 20))
    echo "!! $PY lacks ray/mlflow/hydra: tasks-only check (no sweep, no MLflow), $LEFT s left for it"
    "$PY" scripts/gpu_check_tasks.py --out "$OUT_DIR" --work "$WORK/tasks" --dtypes "$DTYPES" \
        --prompt-len "$PROMPT_LEN" --context-len "$CONTEXT_LEN" --deadline-s "$LEFT"
    rc=$?
    echo "== done in ${SECONDS}s (exit $rc); $OUT_DIR: $(ls "$OUT_DIR" | tr '\n' ' ')"
    exit $rc
fi

# -- the sweep -----------------------------------------------------------------------------
# Settings, each for the budget:
#   phase.prompt_len=128, phase.context_len=1024   prefill a 128-token prompt; decode one token against a 1k
#                                   cache (its KV read is then ~4% of the weights': still a weight-bound step)
#   bench.warmup_max_seconds=2, bench.min_seconds=1, bench.max_seconds=4   GPU timings settle fast
#                                   (CUDA events, no host noise); the median's 2% CI is met in about a second
#   bench.threads=1                 the host side of a CUDA benchmark needs one thread
#   tracking.max_model_mb=0         never copy the 2.5 GB exported models into MLflow
#   tracking.resume=false           a rerun measures every variant again (a check, not a cache), so the
#                                   table, which lists the latest sweep's own runs, is always complete
#   cluster.export_cache=$WORK/...  exports (GBs) on local disk, not in $OUT
#   cluster.max_retries=0           a retry would not fit the budget
#   cluster.task_timeout_s          no task outlives the deadline
# 12 variants: 4 eager-style exports (inputs + reference only) and 4 ONNX exports run in
# parallel on the CPUs; the 12 benchmarks then take the GPU one at a time (each builds its
# model; torch.compile compiles inside its load: the 4 compile variants dominate).
LEFT=$((BUDGET - SECONDS - 30))  # 30 s kept for the table and the copies
if ((LEFT < 120)); then
    echo "!! only ${LEFT}s of the ${BUDGET}s budget left for the sweep; giving it 120s"
    LEFT=120
fi
echo "== sweep: dtypes $DTYPES, $LEFT s left for it"
timeout -s INT -k 30 "$LEFT" "$PY" sweep.py -m \
    model=llama model.size=1b "model.dtype=$DTYPES" \
    phase=prefill,decode backend=eager,compile,onnxruntime device=cuda \
    "phase.prompt_len=$PROMPT_LEN" "phase.context_len=$CONTEXT_LEN" \
    bench.warmup_max_seconds=2 bench.min_seconds=1 bench.max_seconds=4 bench.threads=1 \
    "tracking.uri=sqlite:///$OUT_DIR/gpu.db" "tracking.artifact_root=$WORK/mlartifacts" tracking.max_model_mb=0 tracking.resume=false \
    "cluster.export_cache=$WORK/export_cache" cluster.max_retries=0 "cluster.task_timeout_s=$LEFT" \
    "hydra.sweep.dir=$WORK/multirun"
rc=$?
case $rc in
    0) echo "== sweep finished: every variant ok" ;;
    124 | 130 | 137) echo "!! sweep stopped at the deadline (exit $rc): unfinished variants are recorded as aborted" ;;
    *) echo "!! sweep exited $rc (failed variants are in the table)" ;;
esac

# -- the table -----------------------------------------------------------------------------
echo "== results"
print_table "$OUT_DIR/gpu.db" | tee "$OUT_DIR/gpu_table.txt"
echo "== done in ${SECONDS}s; $OUT_DIR: $(ls "$OUT_DIR" | tr '\n' ' ')"
exit $rc
