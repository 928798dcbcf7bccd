#!/usr/bin/env bash
# Create .venv (once) and install ddlsim into it, with torch pinned to the CPU build.
#   scripts/bootstrap.sh          runtime only
#   scripts/bootstrap.sh --dev    plus the test tools (pytest, ruff, mypy)
# DDLSIM_TORCH_VERSION overrides the torch pin; DDLSIM_TORCH_INDEX names an extra package index
# for it (https://download.pytorch.org/whl/cpu gives the CPU wheel where PyPI's default is CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ddlsim needs Python 3.11 or newer; $("$python" --version 2>&1) found" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

extra=()
if [ -n "${DDLSIM_TORCH_INDEX:-}" ]; then
    extra=(--extra-index-url "$DDLSIM_TORCH_INDEX")
fi
target="."
[ "${1:-}" = "--dev" ] && target=".[dev]"

export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install --quiet "${extra[@]}" "torch==${DDLSIM_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install --quiet -c requirements/constraints.txt -e "$target"
