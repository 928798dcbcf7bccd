"""How long and how much memory a prediction at scale takes on this machine, end to end.

Each run is a fresh ``ddlsim predict MODEL --cluster ... --plan ...`` process (imports,
capture of one shard on fake tensors, pricing, schedule replay); the wall time and the
process's peak resident memory (``ru_maxrss`` of the finished child, from ``os.wait4``) are
reported, as median and range over ``--repeats`` runs. The default is issue 21's case: a
1T-parameter GPT (128 layers, hidden 25,600) on 3,072 A100s with tp 8, pp 64.

    .venv/bin/python benchmarks/scale_capture.py --json
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPT_1T = {
    "source": "transformers",
    "class": "GPT2LMHeadModel",
    "config": {
        "n_embd": 25600,
        "n_head": 160,
        "n_layer": 128,
        "n_inner": 102400,
        "n_positions": 2048,
        "vocab_size": 51200,
    },
    "inputs": {"batch_size": 3072, "seq_len": 2048},
}
PLAN_1T = {
    "parallel": {
        "dp": 6,
        "tp": 8,
        "pp": 64,
        "micro_batches": 512,
        "recompute": "full",
    },
    "precision": "fp16",
}


def run_once(model: Path, plan: str, cluster: str) -> dict[str, float]:
    command = [
        sys.executable,
        "-m",
        "ddlsim.service.cli",
        "predict",
        str(model),
        "--cluster",
        cluster,
        "--plan",
        plan,
        "--json",
    ]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, usage = os.wait4(process.pid, 0)[1:]
    seconds = time.perf_counter() - started
    stdout = process.stdout.read() if process.stdout else b""
    if process.returncode not in (0, None) or not stdout:
        err = process.stderr.read().decode() if process.stderr else ""
        raise SystemExit(f"ddlsim predict failed: {err[-2000:]}")
    result = json.loads(stdout)
    return {
        "seconds": seconds,
        "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30,
        "iteration_s": result["iteration_s"],
        "tflops_per_gpu": result["tflops_per_gpu"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="dgx-a100-80g:384")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "gpt-1t.json"
        model.write_text(json.dumps(GPT_1T), "utf-8")
        runs = [run_once(model, json.dumps(PLAN_1T), args.cluster) for _ in range(args.repeats)]
    seconds = [run["seconds"] for run in runs]
    rss = [run["peak_rss_gib"] for run in runs]
    result = {
        "model": "GPT 1T (128 layers, hidden 25,600)",
        "cluster": args.cluster,
        "plan": PLAN_1T,
        "runs": runs,
        "seconds_median": statistics.median(seconds),
        "seconds_range": [min(seconds), max(seconds)],
        "peak_rss_gib_max": max(rss),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{result['model']} on {args.cluster}: {result['seconds_median']:.1f} s "
            f"(range {min(seconds):.1f}-{max(seconds):.1f}), peak {max(rss):.2f} GiB"
        )


if __name__ == "__main__":
    main()
