#!/usr/bin/env bash
# gpumon run on the real GPUs while a torch matmul runs on GPU 0: GPM, process attribution and
# DCGM-compatible names seen moving through /metrics. Writes $OUT/daemon-demo.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpumon-gpu-check}
state=$(mktemp -d)
printf 'interval_seconds: 1\nslow_interval_seconds: 2\nexporter: {processes: true, compat: [dcgm]}\n' > "$state/gpumon.yaml"
python3 -m gpumon run --config "$state/gpumon.yaml" --listen 127.0.0.1:10480 --state-dir "$state" > "$OUT/daemon-demo.log" 2>&1 &
daemon=$!
get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
for _ in $(seq 50); do get http://127.0.0.1:10480/ready >/dev/null 2>&1 && break; sleep 0.2; done
show() {
  echo "== $1"
  get http://127.0.0.1:10480/metrics | grep -E '^(gpumon_(tensor_active_ratio|sm_active_ratio|dram_active_ratio|gpu_utilization_ratio|power_watts|processes|process_used_memory_bytes|clock_hertz\{domain="sm")|DCGM_FI_PROF_PIPE_TENSOR_ACTIVE|DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED)' | grep 'gpu="0"'
}
sleep 3; show "idle"
CUDA_VISIBLE_DEVICES=0 python3 -c '
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + 12
while time.time() < end:
    for _ in range(50): c = a @ b
    torch.cuda.synchronize()
' &
load=$!
sleep 7; show "under a bf16 matmul (pid $load)"
get http://127.0.0.1:10480/api/snapshot | python3 -c 'import json,sys; d=json.load(sys.stdin); print("processes on GPU 0:", d["gpus"][0].get("processes"))'
wait $load
sleep 4; show "after the matmul"
python3 -m gpumon alerts --url http://127.0.0.1:10480
kill -TERM $daemon; wait $daemon; echo "daemon exit $?"
