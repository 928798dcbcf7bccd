"""One GPU under an external launcher against the GPU-cluster simulator (issue 37's GPU line).

For each model (zoo, >= 100M parameters, at its zoo inputs), run under torchrun on one GPU with
NCCL, bf16 and full recomputation: ``torchrun --nproc-per-node 1 -m ddlsim run MODEL
--launcher env --device cuda --strategy S``, and price the same strategy for one GPU of the
machine's kind with ``ddlsim predict MODEL --cluster '{"preset": P, "gpus_per_node": 1}'``.
Prints measured and predicted iteration times and their ratio; ``--out`` writes them (gzipped
JSON, for ``ddlsim/data/measured/``). The acceptance asks every ratio within 10 %.

    python benchmarks/gpu_env_run.py --models gpt2-small llama-160m bert-base \\
        --out ddlsim/data/measured/h100/env_run.json.gz

Time: about a minute a model on an H100 (capture, warm-up, the protocol's minimums).
"""

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STRATEGY = {"parallel": {"dp": 1, "recompute": "full"}, "precision": "bf16"}
PRESETS = {"H200": "dgx-h200", "H100": "dgx-h100", "A100": "dgx-a100-80g"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _json(command: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])} ... failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    """Long: the benchmark's steps in the order they run on the lent GPU, read top to bottom."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2-small", "llama-160m", "bert-base"])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=240)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    name = torch.cuda.get_device_name()
    preset = next((p for part, p in PRESETS.items() if part in name), None)
    if preset is None:
        raise SystemExit(f"no preset for {name!r}; known: {', '.join(PRESETS)}")
    cluster = json.dumps({"preset": preset, "gpus_per_node": 1})
    bin_dir = Path(sys.executable).parent
    rows = []
    for model in args.models:
        began = time.monotonic()
        env = {**os.environ, "DDLSIM_DB": f"sqlite:///{Path.cwd() / 'gpu_env_run.db'}"}
        measured = _json(
            [
                str(bin_dir / "torchrun"),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{_free_port()}",
                "-m",
                "ddlsim",
                "run",
                model,
                "--launcher",
                "env",
                "--device",
                "cuda",
                "--strategy",
                json.dumps(STRATEGY),
                "--iters",
                str(args.iters),
                "--measure-budget",
                "10",
                "--json",
            ],
            env,
            args.timeout_s,
        )
        predicted = _json(
            [
                str(bin_dir / "ddlsim"),
                "predict",
                model,
                "--cluster",
                cluster,
                "--plan",
                json.dumps(STRATEGY),
                "--json",
            ],
            env,
            args.timeout_s,
        )
        measured_ms = measured["iteration_time_ms"]["median"]
        predicted_ms = predicted["iteration_s"] * 1e3
        rows.append(
            {
                "model": model,
                "gpu": name,
                "measured_ms": measured_ms,
                "ci95_ms": measured["iteration_time_ms"]["ci95_ms"],
                "predicted_ms": predicted_ms,
                "ratio": predicted_ms / measured_ms,
                "peak_memory_bytes": measured["peak_memory_bytes"],
                "predicted_memory": predicted["memory"],
                "losses": measured["losses"],
                "seconds": round(time.monotonic() - began, 1),
            }
        )
        row = rows[-1]
        print(
            f"{model:12s} measured {measured_ms:8.2f} ms  predicted {predicted_ms:8.2f} ms  "
            f"ratio {row['ratio']:.3f}",
            flush=True,
        )
    result = {"strategy": STRATEGY, "torch": torch.__version__, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(args.out, "wt", encoding="utf-8") as handle:
            json.dump(result, handle)


if __name__ == "__main__":
    main()
