#!/usr/bin/env bash
# The burn's diagnostic checks on a real GPU host (one or more GPUs), every figure logged under $OUT:
#   1. the link the GPUs negotiated, from nvidia-smi (to compare with NVML's, in the reports)
#   2. --quick on every GPU: burn clock and wall time, fingerprint digests, pcie figures, GEMM tails
#   3. slow-pcie:0 — GPU 0's host link at a quarter: named by the pcie test
#   4. stall:0 — GPU 0 stalls one GEMM in 50: named by its p99 (matmul/tail)
#   5. the fingerprint across three burn nodes (--nnodes 3 on this host, each burning GPU 0, NCCL not
#      needed), node 1 with sdc:0 (the same wrong answer every time): the merged report names node 1
#   6. --long at a short setting (LONG_SECONDS of soak, default 30) with the power steps
# Usage (from the repository root, gpumon importable): OUT=/tmp/out scripts/gpu-burn-diagnostic.sh
# (EXTRA="--device cpu --backend fake" tries the steps without a GPU; STEPS="stall long" runs only those.)
set -u
OUT=${OUT:-/tmp/gpu-burn-diagnostic}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
EXTRA=${EXTRA:-}
summary="$OUT/summary.txt"

{
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
} >"$summary" 2>&1

STEPS=" ${STEPS:-quick slow-pcie stall fingerprint long} "
step() {  # step NAME SECONDS -- command...   (only the steps named in $STEPS run)
  local name=$1 limit=$2
  shift 3
  [[ "$STEPS" == *" $name "* ]] || return 0
  local t0 t1
  t0=$(date +%s.%N)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  echo "== $name: exit $rc, wall $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s" >>"$summary"
}

step quick 120 -- "$PY" -m gpumon burn $EXTRA --quick --gpus all --state-dir "$OUT/s-quick" --json "$OUT/quick.json" --wide
step slow-pcie 60 -- env GPUMON_BURN_INJECT=slow-pcie:0 "$PY" -m gpumon burn $EXTRA --gpus 0 --tests pcie --quick \
  --state-dir "$OUT/s-pcie" --json "$OUT/slow-pcie.json"
step stall 60 -- env GPUMON_BURN_INJECT=stall:0 "$PY" -m gpumon burn $EXTRA --gpus 0 --tests matmul --duration 8 \
  --state-dir "$OUT/s-stall" --json "$OUT/stall.json"

fingerprint_nodes() {  # three burn nodes on this host, all on GPU 0; node 1 computes wrong every time
  local port=29533 pids=() n
  for n in 0 1 2; do
    local inject=""
    [ "$n" = 1 ] && inject="sdc:0"
    # the three nodes share one GPU: a third of its rate each, so no matmul floor here
    GPUMON_BURN_INJECT=$inject GPUMON_BURN_FLOORS=matmul_tflops=1 "$PY" -m gpumon burn $EXTRA --nnodes 3 --node-rank $n --master-addr 127.0.0.1 \
      --master-port $port --gpus 0 --tests fingerprint,matmul --duration 3 --force \
      --state-dir "$OUT/s-fp$n" --json "$OUT/fp$n.json" >"$OUT/fp-node$n.txt" 2>&1 &
    pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n"; done
  cat "$OUT/fp-node0.txt"
}
step fingerprint 150 -- bash -c "$(declare -f fingerprint_nodes); PY=$PY OUT=$OUT EXTRA='$EXTRA' fingerprint_nodes"

step long $((${LONG_SECONDS:-30} + 120)) -- "$PY" -m gpumon burn $EXTRA --long --duration "${LONG_SECONDS:-30}" \
  --gpus all --tests matmul,pulse --state-dir "$OUT/s-long" --json "$OUT/long.json"

"$PY" - "$OUT" >>"$summary" 2>&1 <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() else None
q = load("quick.json")
if q:
    print("== quick: verdict", q["verdict"], "burn clock", round(q["duration_seconds"], 1), "s; faults", q["faults"])
    for g in q["gpus"]:
        print(" GPU", g["gpu"], g.get("model"), "tests", g["tests"])
        print("  pcie", json.dumps(g.get("pcie")))
        print("  matmul", {k: g.get("matmul", {}).get(k) for k in ("tflops", "p50_ms", "p99_ms")})
        print("  fingerprint", json.dumps(g.get("fingerprint")))
    for c in q["checks"]:
        if c["test"] in ("pcie", "fingerprint") or c["check"] == "tail":
            print("  check", c["test"], c["check"], c["passed"], c["detail"])
lg = load("long.json")
if lg:
    print("== long: verdict", lg["verdict"], "burn clock", round(lg["duration_seconds"], 1), "s")
    for c in lg["checks"]:
        if c["test"] == "pulse" or c["check"] in ("settle", "slowdown", "tail"):
            print("  check", c["test"], c["check"], c["passed"], c["detail"])
    for g in lg["gpus"]:
        print("  settle", json.dumps(g["telemetry"].get("settle")), "pulse", json.dumps(g["telemetry"].get("pulse")))
st = load("stall.json")
if st:
    print("== stall matmul", {k: st["gpus"][0].get("matmul", {}).get(k) for k in ("tflops", "p50_ms", "p99_ms")})
for name in ("slow-pcie.json", "stall.json", "fp0.json", "long.json"):
    r = load(name)
    print("==", name, "verdict", r and r["verdict"], "faults:")
    for f in (r or {}).get("faults", []):
        print("  ", f)
EOF
cat "$summary"
