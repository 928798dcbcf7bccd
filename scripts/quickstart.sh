#!/usr/bin/env bash
# Set up and run the main job on embedded defaults: list the zoo, then capture the training
# iteration graph of GPT-2 small and summarize it (the graph is written to out/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
mkdir -p out
.venv/bin/ddlsim models
.venv/bin/ddlsim graph gpt2-small --out out/gpt2-small.graph.json
