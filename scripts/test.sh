#!/usr/bin/env bash
# Set up and run the whole test suite: lint, format check, type check, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest -n 2 "$@"
