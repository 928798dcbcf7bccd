#!/usr/bin/env bash
# Set up and run the main job on embedded defaults: list the zoo, capture and summarize the
# training-iteration graph of GPT-2 small (written to out/), time every node of a small GPT-2 on
# this CPU, predict its iteration on two ranks with the shipped simulator, then train it on two
# real ranks with DeAR and measure it; profiles, prediction and measurement go to the default
# store (SQLite in the user data dir).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
mkdir -p out
.venv/bin/ddlsim models
.venv/bin/ddlsim graph gpt2-small --out out/gpt2-small.graph.json
.venv/bin/ddlsim profile kernels gpt2-tiny --iters 10 --trace-dir out
.venv/bin/ddlsim predict gpt2-tiny --world-size 2 --bandwidth 1gbit --profile-iters 5 \
    --strategy '{"tensor_fusion": {"bucket_cap_mb": 1, "dear": true}}'
.venv/bin/ddlsim run gpt2-tiny --world-size 2 --iters 5 --bandwidth 1gbit \
    --strategy '{"tensor_fusion": {"bucket_cap_mb": 1, "dear": true}}'
