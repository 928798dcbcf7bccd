#!/usr/bin/env bash
# Wheels of ddlsim's dependencies that a lent GPU machine's image lacks (it has torch,
# transformers, torch-geometric, numpy, pyyaml, tqdm, prometheus-client; nothing can be fetched
# there). Run here once before a GPU session; the device command installs them from .whl/
# (carry .whl). Versions: this checkout's .venv (bash scripts/bootstrap.sh --dev).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
names="sqlalchemy alembic mako markupsafe optuna colorlog cmaes fastapi starlette
  pydantic pydantic-core annotated-types annotated-doc typing-inspection anyio sniffio uvicorn
  h11 click platformdirs submitit cloudpickle"
pins=()
for name in $names; do
  pin=$(.venv/bin/python -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
  if [ -n "$pin" ]; then pins+=("$name==$pin"); fi
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
ls .whl
