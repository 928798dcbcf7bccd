"""One rank of the collective microbenchmark; started on each host by ``profiler.collectives``.

Every repeat is timed on every rank between a barrier and the collective's completion; the
repeat's time is the maximum over ranks (one all-reduce MAX per message size), so stragglers
count. Rank 0 writes ``{"samples": [{"collective", "size_bytes", "times_us"}], ...}`` to
``--output`` and prints one progress line per size.

Buffers are float32. The size is the tensor's total bytes as nccl-tests counts it: the
all-reduced buffer, the full (gathered) buffer for reduce-scatter and all-gather, the broadcast
buffer and, for send/recv, what each rank sends (ring: rank r sends to r+1 and receives from
r-1). Sizes are rounded down to whole elements (and, for reduce-scatter and all-gather, to a
multiple of the world size); the size reported is the one used.

``ring_reduce_scatter`` and ``ring_all_gather`` are the executor's own ring over send/recv
(:mod:`.ring`, what DeAR runs on gloo), run as DeAR runs them: on a thread and process group of
their own (:class:`.ring.CommThread`), so that what the thread costs is measured with them.
"""

import argparse
import functools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddlsim.cluster import groups
from ddlsim.cluster.placement import report_placement
from ddlsim.cluster.processes import die_with_parent
from ddlsim.cluster.ring import CommThread, ring_all_gather, ring_reduce_scatter
from ddlsim.data.shutdown import freeze_for_exit

_ELEMENT_BYTES = 4


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--collectives", required=True, help="comma-separated")
    parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--cpu-repeats",
        type=int,
        default=0,
        help="also time, this many times a size, the compute a collective takes from its rank",
    )
    # Test-only: make a rank exit with a code, or have every rank sleep, after initialization.
    parser.add_argument("--test-crash-rank", type=int, default=-1)
    parser.add_argument("--test-crash-code", type=int, default=3)
    parser.add_argument("--test-sleep-s", type=float, default=0.0)
    return parser.parse_args(argv)


def _operation(
    collective: str,
    size_bytes: int,
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    group: Any = None,
) -> tuple[int, Callable[[], None]]:
    """The bytes actually used and a function that runs the collective once, to completion."""
    used, start = _launcher(collective, size_bytes, rank, world_size, device, group=group)

    def run() -> None:
        for request in start():
            request.wait()

    return used, run


class _Pending:
    """A job on the communication thread, waited on as a request is."""

    def __init__(self, future: "Future[torch.Tensor]") -> None:
        self.future = future

    def wait(self) -> None:
        self.future.result()


# The ring collectives' thread: one a process, created by every rank at its first ring
# collective (the collectives run in the same order on every rank), closed at the end.
_comm: list[CommThread] = []


def close_comm_threads() -> None:
    """Close the ring collectives' thread, if one was started (before the group ends)."""
    for comm in _comm:
        comm.close()
    _comm.clear()


def _comm_thread(device: torch.device) -> CommThread:
    if not _comm:
        _comm.append(CommThread(list(range(dist.get_world_size())), device=device))
    return _comm[0]


GROUP_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def _launcher(
    collective: str,
    size_bytes: int,
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    group: Any = None,
) -> tuple[int, Callable[[], list[Any]]]:
    """The bytes actually used and a function that starts the collective once, asynchronously,
    returning its requests (each has ``wait``); over ``group`` (``world_size`` of its ranks)
    for the collectives of ``GROUP_COLLECTIVES``, over every rank otherwise."""
    if group is not None and collective not in GROUP_COLLECTIVES:
        raise ValueError(f"{collective} runs over every rank only, not over a group")
    numel = max(1, size_bytes // _ELEMENT_BYTES)
    if collective in ("ring_reduce_scatter", "ring_all_gather"):
        comm = _comm_thread(device)
        shard = max(1, numel // world_size)
        full = torch.ones(shard * world_size, device=device)
        part = torch.ones(shard, device=device)
        if collective == "ring_reduce_scatter":
            job = functools.partial(ring_reduce_scatter, full, comm.group)
        else:
            job = functools.partial(ring_all_gather, part, comm.group)
        return full.nbytes, lambda: [_Pending(comm.submit(job))]
    if collective == "all_reduce":
        buffer = torch.ones(numel, device=device)
        return numel * _ELEMENT_BYTES, lambda: [
            dist.all_reduce(buffer, group=group, async_op=True)
        ]
    if collective in ("reduce_scatter", "all_gather"):
        shard = max(1, numel // world_size)
        full = torch.ones(shard * world_size, device=device)
        part = torch.ones(shard, device=device)
        if collective == "reduce_scatter":
            return full.nbytes, lambda: [
                dist.reduce_scatter_tensor(part, full, group=group, async_op=True)
            ]
        return full.nbytes, lambda: [
            dist.all_gather_into_tensor(full, part, group=group, async_op=True)
        ]
    if collective == "all_to_all":
        # An expert-parallel dispatch: each rank's buffer in equal parts, one to every rank.
        chunk = max(1, numel // world_size)
        send = torch.ones(chunk * world_size, device=device)
        receive = torch.empty_like(send)
        return send.nbytes, lambda: [
            dist.all_to_all_single(receive, send, group=group, async_op=True)
        ]
    if collective == "broadcast":
        buffer = torch.ones(numel, device=device)
        return numel * _ELEMENT_BYTES, lambda: [dist.broadcast(buffer, src=0, async_op=True)]
    if collective == "sendrecv":
        send = torch.ones(numel, device=device)
        recv = torch.empty(numel, device=device)
        right, left = (rank + 1) % world_size, (rank - 1) % world_size

        def exchange() -> list[Any]:
            # Receive posted first: with send first, gloo serializes the two directions of a
            # pair (2 ranks at 1gbit: 16 MiB took 280 ms instead of 142).
            requests = [dist.irecv(recv, left), dist.isend(send, right)]
            return [r for r in requests if r is not None]

        return numel * _ELEMENT_BYTES, exchange
    raise ValueError(f"unknown collective {collective!r}")


def _time_repeats(
    run: Callable[[], None],
    warmup: int,
    repeats: int,
    device: torch.device,
    group: Any = None,
) -> list[float]:
    """Per repeat, the slowest rank's (of ``group``, or of all) time in microseconds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    local = []
    for _ in range(repeats):
        dist.barrier(group=group)
        sync()
        start = time.perf_counter()
        run()
        sync()
        local.append((time.perf_counter() - start) * 1e6)
    slowest = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return [float(t) for t in slowest.cpu()]


# One unit of the compute a rank does while a collective runs: a single-threaded matrix product
# of about 30 us, small enough that the unit the collective ends in adds little.
_UNIT_SIDE = 96


def _wait_all(requests: list[Any], finished: threading.Event, failed: list[BaseException]) -> None:
    try:
        for request in requests:
            request.wait()
    except BaseException as exc:  # handed to the computing thread, which raises it
        failed.append(exc)
    finally:  # a failed wait must not leave the computing thread computing forever
        finished.set()


def _stolen_us(
    start: Callable[[], list[Any]], repeats: int, world_size: int, *, window_s: float = 0.1
) -> list[float]:
    """Per repeat, the compute a collective took from its rank (us, the mean over ranks).

    Every rank runs units of compute while the collective is in flight, as a rank's backward
    does while its gradients are all-reduced; gloo's reductions, copies and socket work run on
    the rank's cores too. Against the rate of the same units with no collective (measured just
    before and just after, every rank computing as during), the collective took
    ``elapsed - units / rate`` of compute time.
    """
    a, b = torch.randn(_UNIT_SIDE, _UNIT_SIDE), torch.randn(_UNIT_SIDE, _UNIT_SIDE)
    out = torch.empty(_UNIT_SIDE, _UNIT_SIDE)

    def unit() -> None:
        torch.mm(a, b, out=out)

    def rate() -> float:
        dist.barrier()
        done, begin = 0, time.perf_counter()
        while time.perf_counter() - begin < window_s:
            unit()
            done += 1
        return done / ((time.perf_counter() - begin) * 1e6)

    for _ in range(200):
        unit()
    local = []
    for _ in range(repeats):
        before = rate()
        dist.barrier()
        done, begin = 0, time.perf_counter()
        # A thread waits for the requests (gloo's send/recv never report completion by
        # polling); it sleeps in ``wait``, so it takes no compute of its own.
        finished = threading.Event()
        failed: list[BaseException] = []
        waiter = threading.Thread(target=_wait_all, args=(start(), finished, failed))
        waiter.start()
        while not finished.is_set():
            unit()
            done += 1
        waiter.join()
        if failed:
            raise failed[0]
        elapsed = (time.perf_counter() - begin) * 1e6
        alone = (before + rate()) / 2
        local.append(elapsed - done / alone)
    total = torch.tensor(local, dtype=torch.float64)
    dist.all_reduce(total)
    return [float(t) / world_size for t in total]


def measure(
    collectives: list[str],
    sizes: list[int],
    *,
    warmup: int,
    repeats: int,
    cpu_repeats: int,
    device: torch.device,
    group: Any = None,
    say: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Time every collective at every size on this rank (every rank of ``group``, or of the
    process group, calls it alike); one sample a collective and size: the bytes used, the
    per-repeat times and, on the CPU with ``cpu_repeats``, the compute it takes."""
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    world_size = dist.get_world_size(group) if group is not None else dist.get_world_size()
    samples = []
    for collective in collectives:
        for size_bytes in sizes:
            used_bytes, run = _operation(
                collective, size_bytes, rank, world_size, device, group=group
            )
            times_us = _time_repeats(run, warmup, repeats, device, group)
            sample: dict[str, Any] = {
                "collective": collective,
                "size_bytes": used_bytes,
                "times_us": times_us,
            }
            line = f"{collective} {used_bytes} B: {statistics.median(times_us) / 1e3:.3f} ms"
            if cpu_repeats > 0 and device.type == "cpu" and group is None:
                _, start = _launcher(collective, size_bytes, rank, world_size, device)
                sample["stolen_us"] = _stolen_us(start, cpu_repeats, world_size)
                line += f", {statistics.median(sample['stolen_us']) / 1e3:.3f} ms of compute"
                del start
            samples.append(sample)
            if say is not None:
                say(line)
            del run
    return samples


def main(argv: list[str] | None = None) -> int:
    """Run this rank's benchmark (``argv``: the options, default ``sys.argv``); the exit code."""
    args = _parse_args(argv)
    # This process runs in a session of its own: follow its launcher if it is killed.
    die_with_parent()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.backend == "nccl":
        # Every emulated host is this machine: rank r takes device r.
        device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    groups.join(args.backend, args.timeout_s)
    if rank == args.test_crash_rank:
        print(f"rank {rank}: test crash with exit code {args.test_crash_code}", file=sys.stderr)
        return args.test_crash_code
    if args.test_sleep_s > 0:
        time.sleep(args.test_sleep_s)

    sizes = [int(s) for s in args.sizes.split(",")]
    samples = measure(
        args.collectives.split(","),
        sizes,
        warmup=args.warmup,
        repeats=args.repeats,
        cpu_repeats=args.cpu_repeats,
        device=device,
        say=(lambda line: print(line, flush=True)) if rank == 0 else None,
    )
    close_comm_threads()
    placement = report_placement()
    if rank == 0:
        result = {
            "samples": samples,
            "backend": args.backend,
            "world_size": world_size,
            "torch": torch.__version__,
            "rank0_placement": {
                "allowed_cores": list(placement.allowed_cores),
                "last_core": placement.last_core,
            },
        }
        partial = args.output.with_name(args.output.name + ".partial")
        partial.write_text(json.dumps(result), encoding="utf-8")
        os.replace(partial, args.output)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    freeze_for_exit()
    sys.exit(code)
