#!/usr/bin/env bash
# Collect the GPU dataset gpu-v1 (ddlsim/data/datasets/gpu-v1.yaml) on a lent GPU machine, in
# one call, within a deadline, resuming a store an earlier lease left.
#
# Here, once before the lease:  bash scripts/gpu_wheels.sh
#   (and, to resume: mkdir -p gpu-store && cp LAST_OUT/gpu-v1.db gpu-store/, with /gpu-store/ in
#   .git/info/exclude)
# On the device (the `run` tool, carry [".whl", "gpu-store"], timeout_s 600):
#   bash scripts/gpu_dataset.sh 470
# Then here: ddlsim/data/datasets/gpu-v1.json.gz from $OUT's export, its datasheet in the
# datasets' README.
#
# $OUT receives: gpu-v1.db (the store, to resume from), gpu-v1.json.gz (the exported dataset),
# datasheet.json (GPU, driver, clocks as NVML reads them, torch), batch.json and batch.log.
set -uo pipefail
budget=${1:-470}
out=${OUT:-/tmp/gpu-v1-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "no wheels: run scripts/gpu_wheels.sh here first"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
db=$out/gpu-v1.db
if [ -f gpu-store/gpu-v1.db ]; then cp gpu-store/gpu-v1.db "$db"; fi
python3 - "$out/datasheet.json" <<'EOF'
import json, sys, torch
sheet = {"torch": torch.__version__, "cuda": torch.version.cuda}
try:
    import pynvml as nv
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    sheet.update(
        gpu=nv.nvmlDeviceGetName(h),
        driver=nv.nvmlSystemGetDriverVersion(),
        sm_clock_max_mhz=nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        mem_clock_max_mhz=nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        sm_clock_app_mhz=nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM),
        power_limit_w=nv.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        memory_gib=nv.nvmlDeviceGetMemoryInfo(h).total / 2**30,
    )
except Exception as exc:  # the datasheet says what NVML could not read
    sheet["nvml_error"] = repr(exc)
json.dump(sheet, open(sys.argv[1], "w"), indent=1)
print(sheet)
EOF
start=$(date +%s)
# SIGINT at the deadline: the running job is dropped (redone next lease), the done ones stay.
timeout -s INT -k 20 "$budget" python3 -m ddlsim profile batch \
  ddlsim/data/datasets/gpu-v1.yaml --device cuda --db "sqlite:///$db" --json \
  >"$out/batch.json" 2>"$out/batch.log"
echo "batch: rc $? after $(($(date +%s) - start)) s"
tail -5 "$out/batch.log"
python3 -m ddlsim simulator dataset export --version gpu-v1 --db "sqlite:///$db" \
  --out "$out/gpu-v1.json.gz" --datasheet "$out/datasheet.json" \
  --note "gpu-v1, one GPU, scripts/gpu_dataset.sh" --json |
  head -c 2000
