#!/usr/bin/env bash
# Set up and run the whole test suite: lint, format check, type check, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --dev
# The store's tests run against SQLite and a real PostgreSQL server; as root, set one up.
if [[ -z ${DDLSIM_TEST_POSTGRES_URL:-} && $(id -u) -eq 0 ]]; then
    eval "$(bash scripts/postgres.sh)"
fi
# The dashboard's test drives Debian's headless Chromium; as root, install it when missing.
if [[ $(id -u) -eq 0 ]] && ! command -v chromedriver >/dev/null; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The manual (docs/, MkDocs): a broken link or a page left out of the nav fails here; a stale
# generated reference page fails tests/service/test_reference.py.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# Two workers for everything else; timing tests then run alone, on a quiet machine.
.venv/bin/pytest -n 2 -m "not timing" "$@"
.venv/bin/pytest -m timing "$@"
