#!/usr/bin/env bash
# Set up and run the whole test suite: lint, format check, type check, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --dev
# The store's tests run against SQLite and a real PostgreSQL server; as root, set one up.
if [[ -z ${DDLSIM_TEST_POSTGRES_URL:-} && $(id -u) -eq 0 ]]; then
    eval "$(bash scripts/postgres.sh)"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Two workers for everything else; timing tests then run alone, on a quiet machine.
.venv/bin/pytest -n 2 -m "not timing" "$@"
.venv/bin/pytest -m timing "$@"
