#!/usr/bin/env bash
# One device call that spends a lent GPU's time on every GPU check at once (the device tool
# gives a session 15 minutes, a machine's start included, and 10 minutes a call):
#   1. the device and versions -> gpu/device.txt;
#   2. the CUDA tests (`gpu.sh --tests`, at most 270 s) -> gpu/gpu_tests.txt;
#   3. the suite's STEPs (default: search-gpt2 and ranks, the search on the default workload
#      and the one-rank jobs of each strategy) in the seconds left of TOTAL (default 570) ->
#      gpu/gpu_suite-*.{md,json} and gpu/suite_log.txt (each probe and trial as it ends: a
#      cut-off call keeps them).
# Usage: [TESTS_S=N] bash benchmarks/gpu_call.sh [TOTAL [STEP...]] (TESTS_S: the tests' limit,
# default 270 s; 0 leaves them out, e.g. where the code they cover has not changed since they
# passed). Done: the H200 on 2026-11-26 (tests, search-gpt2, ranks, oracle-gpt2), then issue 18's
# capped case (`TESTS_S=0 gpu_call.sh 580 search-gpt2-capped oracle-gpt2-capped`, then
# `gpu_suite.py --only oracle-gpt2-capped-rest --seconds 165 --search-from <the first call's
# JSON>`: results/archive/gpu/h200-2026-11-26b.md). Next lease: the capped pass whole, in one call
# (`TESTS_S=0 gpu_call.sh 580 oracle-gpt2-capped`, no search: ~560 s), for the cost ratio against
# a complete pass. Then issue 49's GPU figures (2026-11-28, CPU only so far): in a call after
# the install line, `python3 benchmarks/compile_cost.py --machine h100 --device cuda` (cold
# compile and step of compile_scope model vs blocks on GPT-2 small: 12 blocks, where regional
# compilation should save more than the CPU's 4-layer 2.4-3.0x) and a default search's
# artifacts loaded by a fresh `train_autotuned.py` (CUDA entries bundle Triton kernels; the
# CPU's C++ kernels are rebuilt, 1.23x only). And issue 48's: the shape policies on the
# variable-length GPT, searched and side by side, `python3 benchmarks/shapes.py --device cuda
# --precision bf16 --machine h100 --target 64 --rounds 2 --timed-steps 10 --load-note 'GPU.'
# && cp benchmarks/results/shapes_varlen-gpt-h100-* "$OUT"/` (only $OUT comes back). And issue
# 60's, on a machine of several GPUs: `TESTS_S=0 gpu_call.sh 570 search-gpt2 search-gpt2-parallel`
# (the same search with --parallel auto: its wall_s and device_s against search-gpt2's;
# rehearsed on the CPU with `gpu_suite.py --rehearse --only search-gpt2-parallel`).
# Here first: `bash benchmarks/gpu_wheels.sh` (optuna and what the device lacks, into .whl/).
# Then the device tool's run: command `bash benchmarks/gpu_call.sh`, carry [".whl"],
# timeout_s 600. Results under $OUT/gpu (else benchmarks/results/gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
total=${1:-570}
if ! [[ $total =~ ^[0-9]+$ ]] || [ "$total" -lt 120 ] || [ "$total" -gt 600 ]; then
  echo "TOTAL '$total': a whole number of seconds from 120 to 600 (a device call's limit)" >&2
  exit 2
fi
tests_s=${TESTS_S:-270}
if ! [[ $tests_s =~ ^[0-9]+$ ]]; then
  echo "TESTS_S '$tests_s': a whole number of seconds (0 leaves the tests out)" >&2; exit 2
fi
steps=("${@:2}")
[ ${#steps[@]} -gt 0 ] || steps=(search-gpt2 ranks)
only=()
for step in "${steps[@]}"; do only+=(--only "$step"); done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "wheels did not install: run gpu_wheels.sh here"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
# A step name the suite does not know stops here, before the tests spend the call's time.
python3 benchmarks/gpu_suite.py --dry-run "${only[@]}" >/dev/null || exit 2
out="${OUT:-benchmarks/results}/gpu"
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, optuna; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'transformers', transformers.__version__, 'optuna', optuna.__version__)"
  nproc; } 2>&1 | tee "$out/device.txt"
if [ "$tests_s" -gt 0 ]; then
  timeout -k 5 "$tests_s" bash benchmarks/gpu.sh --tests
  echo "tests: exit $? after ${SECONDS} s"
fi
left=$((total - SECONDS - 25))
if [ "$left" -lt 60 ]; then echo "no time left for the suite (${left} s)"; exit 0; fi
timeout -k 5 $((left + 20)) python3 benchmarks/gpu_suite.py "${only[@]}" --seconds "$left" 2>&1 \
  | tee "$out/suite_log.txt"
echo "suite: exit ${PIPESTATUS[0]} after ${SECONDS} s"
