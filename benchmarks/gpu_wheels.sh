#!/usr/bin/env bash
# Fetch, here, the wheels the lent GPU machine lacks (it has torch, transformers, typer, rich,
# nvidia-ml-py, numpy, pyyaml, tqdm, markupsafe, but no optuna and no network) into .whl/.
# Then, in the device tool's run (carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash benchmarks/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx "/.whl/" "$exclude" 2>/dev/null || echo "/.whl/" >> "$exclude"
rm -rf .whl && mkdir -p .whl
for pkg in "optuna==5.0.0" alembic colorlog "sqlalchemy>=2" mako greenlet; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl "$pkg"
done
ls -la .whl
