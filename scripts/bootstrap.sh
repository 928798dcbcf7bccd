#!/usr/bin/env bash
# Create .venv (once) and install ddlsim into it, with torch pinned to its CPU build.
#   scripts/bootstrap.sh          runtime only
#   scripts/bootstrap.sh --dev    plus the test tools (pytest, ruff, mypy)
# DDLSIM_TORCH_VERSION overrides the torch pin (default 2.13.0); DDLSIM_TORCH_INDEX overrides
# the index the CPU build is fetched from when the configured indexes do not have it.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ddlsim needs Python 3.11 or newer; $("$python" --version 2>&1) found" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

torch_version="${DDLSIM_TORCH_VERSION:-2.13.0}"
cpu_index="${DDLSIM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
installed="$(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
if [ "$installed" != "${torch_version}+cpu" ]; then
    # The CPU build carries the local version "+cpu": first from the indexes pip is configured
    # with (a mirror or a local wheel directory), else from PyTorch's CPU index.
    "${pip[@]}" "torch==${torch_version}+cpu" 2>/dev/null \
        || "${pip[@]}" --extra-index-url "$cpu_index" "torch==${torch_version}+cpu"
fi

target="."
[ "${1:-}" = "--dev" ] && target=".[dev]"
"${pip[@]}" -c requirements/constraints.txt -e "$target"
