#!/usr/bin/env bash
# The GPU benchmarks in one go (about 10 minutes on one H100): searches on GPT-2 small and
# BERT-base, the exhaustive oracle on BERT-base, the naive baseline, the estimator table.
# Results: $OUT/gpu/ when OUT is set, else benchmarks/results/gpu/. Pass --dry-run to list.
# Before a GPU call, here: `bash benchmarks/gpu.sh --rehearse` runs every step's code on the
# CPU with tiny models, each search stopped after 5 child runs (about 2 minutes; -> gpu-rehearsal/,
# no GPU figures).
# `--tests` runs the CUDA tests instead (tests/test_gpu.py, marker gpu) -> gpu/gpu_tests.txt.
# PYTHON picks the interpreter (default: python3 on PATH).
#
# A lease of 15 minutes: `benchmarks/gpu_call.sh` (the tests, search-gpt2 and ranks in one call).
# On a lent GPU (device tool): run `bash benchmarks/gpu_wheels.sh` here, then calls with carry
# [".whl"], each under 10 minutes and each starting with the install line in gpu_wheels.sh:
#   1. bash benchmarks/gpu.sh --tests; bash benchmarks/gpu.sh --only estimate
#   2. bash benchmarks/gpu.sh --only search-gpt2
#   3. bash benchmarks/gpu.sh --only search-bert --only oracle-bert
# (or the whole suite in one call). With --only the results are named after the steps run.
# Give each call the tool's whole 600 s (a step plans up to ~580 s; the first GPU run cut
# search-gpt2 at 340 s and got nothing): every probe point and trial is logged to stderr as it
# ends, so a call cut off still returns them in its output.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--tests" ]; then
  out="${OUT:+$OUT/gpu}"
  out="${out:-benchmarks/results/gpu}"
  mkdir -p "$out"
  "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 \
    | tee "$out/gpu_tests.txt"
  exit "${PIPESTATUS[0]}"
fi
exec "${PYTHON:-python3}" benchmarks/gpu_suite.py "$@"
