#!/usr/bin/env bash
# Set up and run the main job on embedded defaults: start the service (REST API, dashboard and
# a worker) on the default SQLite store with the shipped simulator, run a small end-to-end
# pipeline through its API (profile -> predict -> search -> execute on 2 emulated ranks, all
# stored), print the dashboard's address and keep serving until Ctrl-C.
#   DDLSIM_PORT (default 8000) sets the port; DDLSIM_QUICKSTART_EXIT=1 stops after the pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
port="${DDLSIM_PORT:-8000}"
url="http://127.0.0.1:${port}"
.venv/bin/ddlsim serve --port "$port" &
server=$!
# End the server (and, through it, its worker) by its id, however this script ends.
trap 'kill -INT "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    if .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$url/healthz', timeout=2)" \
        2>/dev/null; then
        break
    fi
    kill -0 "$server" 2>/dev/null || { echo "quickstart: the service did not start" >&2; exit 1; }
    sleep 0.5
done
.venv/bin/ddlsim demo --url "$url"
echo "The service keeps running: open $url/ (API docs: $url/docs); Ctrl-C stops it."
[ "${DDLSIM_QUICKSTART_EXIT:-0}" = "1" ] || wait "$server"
