#!/usr/bin/env bash
# The GPU benchmarks in one go (about 10 minutes on one H100): searches on GPT-2 small and
# BERT-base, the exhaustive oracle on BERT-base, the naive baseline, the estimator table.
# Results: $OUT/gpu/ when OUT is set, else benchmarks/results/gpu/. Pass --dry-run to list.
# Before a GPU call, here: `bash benchmarks/gpu.sh --rehearse` runs every step's code on the
# CPU with tiny models (about 2 minutes; -> gpu-rehearsal/, no GPU figures).
# PYTHON picks the interpreter (default: python3 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" benchmarks/gpu_suite.py "$@"
