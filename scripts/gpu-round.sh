#!/usr/bin/env bash
# One round's check of the whole tree on a real GPU host, every log under $OUT (packed into a few files):
#   1. the host recorded idle and under load (tests/gpu/record_host.sh), each replay compared with its poll
#   2. every gpu-marked test (daemon, health, burn), against nvidia-smi in the same run
#   3. `gpumon burn --gpus all --quick` (burn clock), `gpumon health --local` and `gpumon once` on the real GPUs
# Usage, from the repository root with gpumon importable: OUT=/tmp/out NAME=h200-1gpu scripts/gpu-round.sh
set -u
OUT=${OUT:-/tmp/gpu-round}
NAME=${NAME:-host}
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m compileall -q gpumon >/dev/null
nvidia-smi >"$OUT/logs/nvidia-smi.txt" 2>&1
timeout 120 bash tests/gpu/record_host.sh "$NAME" "$OUT/rec" >"$OUT/logs/record.log" 2>&1
echo "record rc=$?" | tee -a "$OUT/summary.txt"
timeout 330 python3 -m pytest -m gpu tests -q -p no:cacheprovider -rfEs >"$OUT/logs/gpu-tests.log" 2>&1
echo "gpu tests rc=$? $(tail -1 "$OUT/logs/gpu-tests.log")" | tee -a "$OUT/summary.txt"
start=$SECONDS
timeout 90 python3 -m gpumon burn --gpus all --quick --json "$OUT/logs/burn-quick.json" --state-dir "$OUT/state" \
  >"$OUT/logs/burn-quick.log" 2>&1
echo "burn --quick rc=$? wall $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
timeout 60 python3 -m gpumon health --local --state-dir "$OUT/state" >"$OUT/logs/health.log" 2>&1
echo "health --local rc=$? $(head -1 "$OUT/logs/health.log")" | tee -a "$OUT/summary.txt"
COLUMNS=80 timeout 30 python3 -m gpumon once >"$OUT/logs/once.txt" 2>&1
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs
