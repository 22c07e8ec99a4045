#!/usr/bin/env bash
# One lean round's figures on a real GPU host, every log under $OUT: this tree against a before tree,
# side by side and against the bare-pynvml floor, at a scrape every 15 s and every second.
# Usage, from the repository root with gpumon importable: OUT=/tmp/out BEFORE=.dev/b0 PART=1|2 scripts/lean-round.sh
#   PART 1: bench_daemon_floor.py --before (before, after and the floor, one after the other) at 15 s and 1 s
#   PART 2: bench_daemon_ab.py --backend nvml (before and after side by side) at 15 s and 1 s, and the
#           per-thread profile of this tree (bench_daemon_threads.py --backend nvml --parts) at 15 s
set -u
OUT=${OUT:-/tmp/lean-round}
BEFORE=${BEFORE:?a before tree (git archive REV gpumon | tar -x -C DIR)}
SECONDS_EACH=${SECONDS_EACH:-60}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m compileall -q gpumon "$BEFORE" >/dev/null
nvidia-smi -L >"$OUT/host.txt" 2>&1
python3 -V >>"$OUT/host.txt" 2>&1
if [ "${PART:-1}" = 1 ]; then
  for scrape in 15 1; do
    python3 benchmarks/bench_daemon_floor.py --seconds "$SECONDS_EACH" --warmup 3 --scrape-interval "$scrape" \
      --before "$BEFORE" >"$OUT/floor-$scrape.txt" 2>&1
    echo "floor scrape=$scrape rc=$?"
  done
else
  for scrape in 15 1; do
    python3 benchmarks/bench_daemon_ab.py "$BEFORE" --backend nvml --seconds "$((SECONDS_EACH * 2))" \
      --scrape-interval "$scrape" >"$OUT/ab-$scrape.txt" 2>&1
    echo "ab scrape=$scrape rc=$?"
  done
  python3 benchmarks/bench_daemon_threads.py --backend nvml --parts --seconds "$SECONDS_EACH" \
    --scrape-interval 15 >"$OUT/threads-15.txt" 2>&1
  echo "threads rc=$?"
fi
grep -h "ratio\|floor:\|gpumon run\|before" "$OUT"/*.txt | grep -v "^#" | head -40
