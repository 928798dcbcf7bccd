"""Per-op times on one GPU: what a roofline per op class is calibrated on.

Times the op classes a transformer's (or a convnet's) training step is made of, on one device,
each at shapes that span the layers of models from 100M to 1T parameters:

* ``gemm``: ``(m, k) @ (k, n)`` in bf16 (``gemm_other``: fp16, tf32 and fp32, timed last), at
  the shapes of a layer's QKV, output projection and MLP (and their tensor-parallel shards), in
  the three layouts a training step uses (forward ``nn``, input gradient ``nt``, weight gradient
  ``tn``);
* ``sdpa``: ``scaled_dot_product_attention`` forward and forward + backward, causal or not, at
  head sizes 64 and 128 and sequence lengths 512 to 8,192 (the backend torch picks);
* ``elementwise``, ``norm``, ``softmax``, ``cross_entropy``, ``copy``: the memory-bound classes,
  forward and (where it has one) forward + backward;
* ``adamw``: one optimizer step over 10 million to 1 billion parameters, fused and foreach;
* ``gemm_fp8`` (on request): ``torch._scaled_mm`` in float8 e4m3 at the forward shapes.

Each case is timed with CUDA events call by call after warm-up calls, as many calls as fit in
``--case-s`` seconds (at least 3); the record keeps the median, the quartiles, the FLOPs and the
bytes the op must move at least (inputs read once, outputs written once), so that achieved
TFLOP/s and GB/s follow. The whole run stops at ``--budget-s`` and says where. Needs only torch;
the output is gzipped JSON (what ``ddlsim/data/measured/`` keeps).

    python benchmarks/gpu_ops.py --budget-s 240 --out ops_cuda.json.gz
"""

import argparse
import functools
import gzip
import json
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ddlsim.profiler.op_timer import OutOfBudgetError, Timer

DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "tf32": torch.float32,
}
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}


def gemm_cases(quick: bool, dtypes: tuple[str, ...]) -> Iterator[tuple[str, int, int, int, str]]:
    """(dtype, m, k, n, layout): a layer's shapes at hidden sizes 768 to 16,384, tokens 128 to
    32,768, whole and split eight ways (tensor parallel)."""
    hiddens = [128] if quick else [768, 1024, 2048, 4096, 8192, 12288, 16384]
    tokens = [64] if quick else [128, 512, 2048, 8192, 32768]
    for dtype in dtypes:
        for h in hiddens:
            for m in tokens:
                if dtype != "bf16" and (m not in (2048, 8192) and not quick):
                    continue
                if dtype in ("fp32", "tf32") and h > 8192:
                    continue
                shapes = [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)]
                if h >= 4096:
                    shapes += [(h, 3 * h // 8), (h // 8, h), (h, h // 2), (4 * h // 8, h)]
                for k, n in shapes:
                    layouts = ("nn", "nt", "tn") if dtype == "bf16" else ("nn",)
                    for layout in layouts:
                        yield dtype, m, k, n, layout


def run_gemms(
    timer: Timer, quick: bool, out: list[dict[str, Any]], dtypes: tuple[str, ...] = ("bf16",)
) -> None:
    device = timer.device
    for dtype, m, k, n, layout in gemm_cases(quick, dtypes):
        flops = 2 * m * k * n
        # fp32 without tensor cores runs ~15x slower: keep its cases short.
        if flops > (4e13 if dtype in ("bf16", "fp16") else 4e12):
            continue
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        torch_dtype = DTYPES[dtype]
        a = torch.randn(m, k, device=device, dtype=torch_dtype)
        b = torch.randn(k, n, device=device, dtype=torch_dtype)
        if layout == "nt":  # dX = dY @ W^T: the weight stored (n, k)
            b = torch.randn(n, k, device=device, dtype=torch_dtype).t()
        elif layout == "tn":  # dW = X^T @ dY: the activation stored (k, m)
            a = torch.randn(k, m, device=device, dtype=torch_dtype).t()
        timing = timer.time(functools.partial(torch.mm, a, b))
        moved = BYTES[dtype] * (m * k + k * n + m * n)
        out.append(
            {
                "op": "gemm",
                "dtype": dtype,
                "m": m,
                "k": k,
                "n": n,
                "layout": layout,
                "flops": flops,
                "bytes": moved,
                **timing,
            }
        )
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False


def run_fp8_gemms(timer: Timer, quick: bool, out: list[dict[str, Any]]) -> None:
    """``torch._scaled_mm`` in float8 (e4m3 inputs, per-tensor scales, bf16 out) at the bf16
    forward shapes: what fp8 training's matmuls run."""
    device = timer.device
    for _, m, k, n, layout in gemm_cases(quick, ("bf16",)):
        if layout != "nn" or 2 * m * k * n > 4e13 or k % 16 or n % 16:
            continue
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        # the second operand column-major, as the fp8 kernels want it
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        timing = timer.time(
            functools.partial(
                torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            )
        )
        out.append(
            {
                "op": "gemm",
                "dtype": "fp8",
                "m": m,
                "k": k,
                "n": n,
                "layout": "nn",
                "flops": 2 * m * k * n,
                "bytes": m * k + k * n + 2 * m * n,
                **timing,
            }
        )


def run_sdpa(timer: Timer, quick: bool, out: list[dict[str, Any]]) -> None:
    device = timer.device
    tokens = 16384 if not quick else 2048
    for head_dim, heads in ((128, 32), (64, 16)) if not quick else ((64, 4),):
        for seq in [512, 1024, 2048, 4096, 8192] if not quick else [256, 1024]:
            batch = max(1, tokens // seq)
            for causal in (True, False):
                q, k, v = (
                    torch.randn(
                        batch,
                        heads,
                        seq,
                        head_dim,
                        device=device,
                        dtype=torch.bfloat16,
                        requires_grad=True,
                    )
                    for _ in range(3)
                )
                grad = torch.randn_like(q)
                flops = 4 * batch * heads * seq * seq * head_dim // (2 if causal else 1)

                forward = functools.partial(
                    F.scaled_dot_product_attention, q, k, v, is_causal=causal
                )
                both = functools.partial(_forward_backward, forward, grad)

                with torch.no_grad():
                    fwd = timer.time(forward)
                full = timer.time(both)
                moved = 2 * 4 * batch * heads * seq * head_dim
                common = {
                    "op": "sdpa",
                    "dtype": "bf16",
                    "batch": batch,
                    "heads": heads,
                    "seq": seq,
                    "head_dim": head_dim,
                    "causal": causal,
                    "bytes": moved,
                }
                out.append({**common, "pass": "forward", "flops": flops, **fwd})
                out.append(
                    {**common, "pass": "forward_backward", "flops": int(3.5 * flops), **full}
                )
                del q, k, v, grad


def _forward_backward(forward: Callable[[], torch.Tensor], grad: torch.Tensor) -> None:
    forward().backward(grad)


def _memory_bound(
    timer: Timer,
    op: str,
    dtype: str,
    shape: tuple[int, ...],
    fn_of: Callable,
    *,
    inputs: int,
    backward: bool,
    out: list[dict[str, Any]],
    **extra: Any,
) -> None:
    device = timer.device
    torch_dtype = DTYPES[dtype]
    xs = [
        torch.randn(*shape, device=device, dtype=torch_dtype, requires_grad=backward)
        for _ in range(inputs)
    ]
    elements = 1
    for size in shape:
        elements *= size
    fn = fn_of(xs)
    with torch.no_grad():
        fwd = timer.time(fn)
    moved = BYTES[dtype] * elements * (inputs + 1)
    out.append(
        {
            "op": op,
            "dtype": dtype,
            "shape": list(shape),
            "pass": "forward",
            "bytes": moved,
            **extra,
            **fwd,
        }
    )
    if backward:
        grad = torch.randn(fn().shape, device=device, dtype=torch_dtype)

        def both() -> None:
            fn().backward(grad)

        full = timer.time(both)
        out.append(
            {
                "op": op,
                "dtype": dtype,
                "shape": list(shape),
                "pass": "forward_backward",
                "bytes": 3 * moved,
                **extra,
                **full,
            }
        )


def run_memory_bound(timer: Timer, quick: bool, out: list[dict[str, Any]]) -> None:
    def time_op(
        op: str,
        dtype: str,
        shape: tuple[int, ...],
        fn_of: Callable,
        *,
        inputs: int = 1,
        backward: bool = True,
        **extra: Any,
    ) -> None:
        _memory_bound(
            timer, op, dtype, shape, fn_of, inputs=inputs, backward=backward, out=out, **extra
        )

    sizes = [1 << 16, 1 << 20, 1 << 24, 1 << 27] if not quick else [1 << 12, 1 << 16]
    for dtype in ("bf16", "fp32"):
        for elements in sizes:
            shape = (elements // 1024, 1024)
            time_op(
                "add", dtype, shape, lambda xs: lambda: xs[0] + xs[1], inputs=2, backward=False
            )
            time_op("gelu", dtype, shape, lambda xs: lambda: F.gelu(xs[0]))
            time_op("silu_mul", dtype, shape, lambda xs: lambda: F.silu(xs[0]) * xs[1], inputs=2)
            time_op("copy", dtype, shape, lambda xs: xs[0].clone, backward=False)
    rows = 16384 if not quick else 512
    for dtype in ("bf16", "fp32"):
        for hidden in [1024, 4096, 12288] if not quick else [256]:
            shape = (rows, hidden)
            w = torch.ones(hidden, device=timer.device, dtype=DTYPES[dtype])
            time_op(
                "layer_norm",
                dtype,
                shape,
                lambda xs, w=w: lambda: F.layer_norm(xs[0], (xs[0].shape[-1],), w),
            )
            time_op(
                "rms_norm",
                dtype,
                shape,
                lambda xs, w=w: lambda: F.rms_norm(xs[0], (xs[0].shape[-1],), w),
            )
            time_op("softmax", dtype, shape, lambda xs: lambda: torch.softmax(xs[0], dim=-1))
    tokens = 8192 if not quick else 256
    for vocab in [32000, 50257, 128256] if not quick else [1000]:
        t = torch.randint(0, vocab, (tokens,), device=timer.device)
        time_op(
            "cross_entropy",
            "bf16",
            (tokens, vocab),
            lambda xs, t=t: lambda: F.cross_entropy(xs[0], t),
            vocab=vocab,
        )


def run_adamw(timer: Timer, quick: bool, out: list[dict[str, Any]]) -> None:
    totals = [10_000_000, 100_000_000, 1_000_000_000] if not quick else [100_000]
    for total in totals:
        chunk = min(total, 16 * 1024 * 1024)
        params = [
            torch.nn.Parameter(torch.randn(chunk, device=timer.device))
            for _ in range(max(1, total // chunk))
        ]
        for p in params:
            p.grad = torch.randn_like(p)
        count = sum(p.numel() for p in params)
        for impl in ("fused", "foreach"):
            if impl == "fused" and timer.device.type != "cuda":
                continue
            if impl == "fused":
                optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
            else:
                optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
            timing = timer.time(optimizer.step, max_calls=20)
            out.append(
                {
                    "op": "adamw",
                    "impl": impl,
                    "dtype": "fp32",
                    "params": count,
                    "tensors": len(params),
                    "bytes": 4 * count * 7,
                    **timing,
                }
            )
            del optimizer
        del params


def _nvidia_smi() -> str | None:
    try:
        return subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--case-s", type=float, default=0.08, help="seconds of calls a case")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke test")
    parser.add_argument(
        "--only", nargs="*", default=["gemm", "sdpa", "memory", "adamw", "gemm_other"]
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    timer = Timer(device, args.budget_s, args.case_s)
    records: list[dict[str, Any]] = []
    sections: dict[str, Callable[[Timer, bool, list[dict[str, Any]]], None]] = {
        "gemm": run_gemms,
        "sdpa": run_sdpa,
        "memory": run_memory_bound,
        "adamw": run_adamw,
        "gemm_other": functools.partial(run_gemms, dtypes=("fp16", "tf32", "fp32")),
        "gemm_fp8": run_fp8_gemms,
    }
    done, stopped = [], None
    started = time.monotonic()
    failed: dict[str, str] = {}
    for name in args.only:
        try:
            sections[name](timer, args.quick, records)
            done.append(name)
        except OutOfBudgetError:
            stopped = name
            break
        except RuntimeError as exc:  # a section the device or build cannot run (fp8)
            failed[name] = str(exc).splitlines()[0][:300]
        print(f"{name}: {len(records)} records, {time.monotonic() - started:.0f} s", flush=True)
    meta: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "sections_done": done,
        "sections_failed": failed,
        "stopped_in": stopped,
        "seconds": round(time.monotonic() - started, 1),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(
            name=props.name,
            multiprocessors=props.multi_processor_count,
            memory_bytes=props.total_memory,
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            nvidia_smi=_nvidia_smi(),
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as handle:
        json.dump({"meta": meta, "records": records}, handle)
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
