#!/usr/bin/env bash
# Record this host's GPUs with `gpumon record`, idle and under a torch bf16 matmul load on every GPU,
# replay each recording with `gpumon once --backend replay:`, and compare the replay with the snapshot
# the recording poll made (tests/gpu/once_diff.py). nvidia-smi -q -x is kept beside each, for comparison.
#   tests/gpu/record_host.sh NAME OUTDIR     e.g. tests/gpu/record_host.sh h200-1gpu /tmp/rec
# Writes OUTDIR/NAME-idle.json, OUTDIR/NAME-load.json (the recordings, --redact) and OUTDIR/cmp.tar.gz.
set -u
name=$1
out=$2
py=${PYTHON:-python3}
mkdir -p "$out/cmp"
cmp=$out/cmp
record() {  # phase label
    nvidia-smi -q -x >"$cmp/nvidia-smi-$1.xml"
    $py -m gpumon record --polls "${POLLS:-10}" --interval-seconds 1 --label "$2" --redact \
        -o "$out/$name-$1.json" --snapshot-json "$cmp/$1-recorded.json"
    nvidia-smi -q -x >"$cmp/nvidia-smi-$1-after.xml"
    $py tests/gpu/nvidia_smi_facts.py "$cmp/nvidia-smi-$1.xml" "$cmp/nvidia-smi-$1-after.xml" >"$out/$name-$1.nvidia-smi.json"
    $py -m gpumon once --backend "replay:$out/$name-$1.json" --json "$cmp/$1-replayed.json" >/dev/null
    $py -m gpumon once --json "$cmp/$1-live.json" >/dev/null
    $py tests/gpu/once_diff.py "$cmp/$1-recorded.json" "$cmp/$1-replayed.json" >"$cmp/$1-diff.txt"
    echo "== $1: recorded poll vs its replay"; cat "$cmp/$1-diff.txt"
}
record idle idle
$py - >"$cmp/load.log" 2>&1 <<'PY' &
import time, torch
mats = []
for d in range(torch.cuda.device_count()):
    a = torch.randn(8192, 8192, device=f"cuda:{d}", dtype=torch.bfloat16)
    mats.append((a, torch.randn_like(a)))
end = time.time() + 150
while time.time() < end:
    for a, b in mats:
        for _ in range(8):
            a @ b
    for d in range(len(mats)):
        torch.cuda.synchronize(d)
PY
load=$!
for _ in $(seq 120); do  # until the load shows (torch and CUDA start in ~10 s)
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | awk '$1 > 80 {ok=1} END {exit !ok}' && break
    sleep 1
done
sleep 3
record load "load: torch bf16 matmul 8192 on every GPU"
kill "$load"; wait "$load" 2>/dev/null
nvidia-smi >"$cmp/nvidia-smi.txt"
tar czf "$out/cmp.tar.gz" -C "$out" cmp
ls -l "$out"
