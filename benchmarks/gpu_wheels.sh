#!/usr/bin/env bash
# Fetch, here, the wheels the lent GPU machine lacks (it has torch, transformers, typer, rich,
# nvidia-ml-py, numpy, pyyaml, tqdm, markupsafe, narwhals, but no optuna, pydantic or plotly, and no
# network) into .whl/.
# Then, in the device tool's run (carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash benchmarks/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx "/.whl/" "$exclude" 2>/dev/null || echo "/.whl/" >> "$exclude"
rm -rf .whl && mkdir -p .whl
for pkg in "optuna==5.0.0" alembic colorlog "sqlalchemy>=2" mako greenlet "pydantic==2.14.4" \
    "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5" "plotly==7.1.0"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl "$pkg"
done
ls -la .whl
