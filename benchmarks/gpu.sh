#!/usr/bin/env bash
# The GPU benchmarks in one go (about 10 minutes on one H100): searches on GPT-2 small and
# BERT-base, the exhaustive oracle on BERT-base, the naive baseline, the estimator table.
# Results: $OUT/gpu/ when OUT is set, else benchmarks/results/gpu/. Pass --dry-run to list.
# PYTHON picks the interpreter (default: python on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" benchmarks/gpu_suite.py "$@"
