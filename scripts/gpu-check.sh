#!/usr/bin/env bash
# Everything that needs a real GPU, in one go: gpu-marked tests, benchmarks, nvidia-smi for comparison.
#   OUT=/tmp/out scripts/gpu-check.sh [nvml] [burn-tests] [burn-bench] [allreduce-small] [daemon] [burn-scale]   (default: all)
# burn-scale: `gpumon burn --gpus all --quick` as it is, then with the last GPU made slow (GPUMON_BURN_INJECT):
# the wall time, p2p matrix and all-reduce busbw of every GPU, and the pairwise runs that isolate the slow one.
# Logs go to $OUT. Wheels for packages the GPU image lacks may be in .whl/ (installed to /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpumon-gpu-check}
mkdir -p "$OUT"
parts=${*:-nvml burn-tests burn-bench allreduce-small daemon burn-scale}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# bytecode, as an installed gpumon has it: a daemon that compiles its modules at start has a larger heap
python3 -m compileall -q gpumon benchmarks > /dev/null
{
  nvidia-smi
  nvidia-smi topo -m
  nvidia-smi nvlink --status | head -40
  nvidia-smi --query-gpu=index,gpu_recovery_action,utilization.encoder,utilization.decoder,remapped_rows.histogram.max,remapped_rows.histogram.none --format=csv
  command -v all_reduce_perf || echo "nccl-tests all_reduce_perf: not installed on this host"
  python3 -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count()); print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))'
} > "$OUT/host.txt" 2>&1
has() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }
if has nvml; then
  timeout 300 python3 -m pytest -m gpu tests --ignore=tests/burn -s -v -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc=$?" | tee -a "$OUT/summary.txt"
  timeout 120 python3 benchmarks/bench_nvml_calls.py > "$OUT/bench-nvml.log" 2>&1
  echo "bench_nvml rc=$?" | tee -a "$OUT/summary.txt"
  timeout 120 python3 benchmarks/bench_daemon.py --backend nvml --seconds 20 > "$OUT/bench-daemon.log" 2>&1
  echo "bench_daemon rc=$?" | tee -a "$OUT/summary.txt"
  timeout 120 python3 benchmarks/bench_memory.py --seconds 20 > "$OUT/bench-memory.log" 2>&1
  echo "bench_memory rc=$?" | tee -a "$OUT/summary.txt"
  timeout 60 python3 benchmarks/bench_poll_pieces.py > "$OUT/bench-poll-pieces.log" 2>&1
  echo "bench_poll_pieces rc=$?" | tee -a "$OUT/summary.txt"
  python3 -m gpumon once > "$OUT/once.txt" 2>&1; python3 -m gpumon once --json > "$OUT/once.json" 2>&1
fi
if has daemon; then
  timeout 90 bash scripts/gpu-daemon-demo.sh > "$OUT/daemon-demo.txt" 2>&1
  echo "daemon demo rc=$?" | tee -a "$OUT/summary.txt"
fi
if has burn-tests; then
  timeout 330 python3 -m pytest -m gpu tests/burn -s -v -p no:cacheprovider > "$OUT/burn-tests.log" 2>&1
  echo "burn tests rc=$?" | tee -a "$OUT/summary.txt"
fi
if has burn-bench; then
  timeout 500 python3 benchmarks/bench_burn.py --seconds 15 > "$OUT/bench-burn.log" 2>&1
  echo "bench_burn rc=$?" | tee -a "$OUT/summary.txt"
fi
if has allreduce-small; then
  timeout 400 python3 benchmarks/bench_allreduce_small.py > "$OUT/bench-allreduce-small.log" 2>&1
  echo "bench_allreduce_small rc=$?" | tee -a "$OUT/summary.txt"
fi
if has burn-scale; then
  start=$(date +%s)
  timeout 150 python3 -m gpumon burn --gpus all --quick --json "$OUT/burn-quick.json" --state-dir "$OUT/burn-state" > "$OUT/burn-quick.log" 2>&1
  echo "burn --quick rc=$? wall $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  last=$(( $(nvidia-smi --list-gpus | wc -l) - 1 ))
  start=$(date +%s)
  GPUMON_BURN_INJECT=slow:$last timeout 200 python3 -m gpumon burn --gpus all --quick --json "$OUT/burn-slow.json" \
    --state-dir "$OUT/burn-state" > "$OUT/burn-slow.log" 2>&1
  echo "burn --quick with GPU $last slow rc=$? (1 expected) wall $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
fi
tail -n 3 "$OUT"/*.log
