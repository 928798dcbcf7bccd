"""One rank of the resharding microbenchmark; started on each host by ``profiler.resharding``.

Ranks ``0 .. S-1`` are the source mesh, ``S .. S+D-1`` the destination mesh. Every rank keeps a
float32 buffer of the whole tensor and moves slices of it by their place in the whole, as
:func:`ddlsim.data.resharding.plan_transfers` plans them: ``sendrecv_allgather`` by send/recv
(then, into a replicating destination of several ranks, ``all_gather_into_tensor`` over the
destination's group), ``broadcast`` by one asynchronous broadcast a tile from its source rank to
the destination ranks (each source rank's group made once). Each repeat is timed on every rank
from a barrier to its last message's completion, and the repeat's time is the slowest rank's;
within a repeat the methods take turns in an order that alternates, so that both see the same
machine. Rank 0 writes ``{"samples": [{"method", "size_bytes", "times_us"}]}`` to ``--output``.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddlsim.cluster import groups as process_groups
from ddlsim.cluster.processes import die_with_parent
from ddlsim.data.resharding import RESHARD_METHODS, MeshLayout, plan_transfers
from ddlsim.data.shutdown import freeze_for_exit

_ELEMENT_BYTES = 4


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--src", required=True, help="RANKS:LAYOUT of the source mesh")
    parser.add_argument("--dst", required=True, help="RANKS:LAYOUT of the destination mesh")
    parser.add_argument("--methods", default=",".join(RESHARD_METHODS))
    parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Move:
    """One method and size on this rank: ``run`` moves ``whole`` (the buffer sent and
    received into), and ``result`` is what a destination rank ends up holding."""

    run: Callable[[], None]
    whole: torch.Tensor
    result: torch.Tensor


class Mover:
    """The moves of one method and size on this rank."""

    def __init__(
        self, rank: int, src: MeshLayout, dst: MeshLayout, groups: dict[str, Any]
    ) -> None:
        self.rank, self.src, self.dst, self.groups = rank, src, dst, groups

    def operation(self, method: str, elements: int) -> Move:
        src, dst, rank = self.src, self.dst, self.rank
        whole = torch.ones(elements)
        gathered = torch.empty(elements)
        nbytes = elements * _ELEMENT_BYTES
        transfers = plan_transfers(nbytes, src, dst, method)
        tiles = max((t.tile for t in transfers), default=0) + 1
        tile_elements = elements // tiles  # the caller makes elements a multiple of the tiles
        gather = method == "sendrecv_allgather" and dst.layout == "replicate" and dst.ranks > 1

        def run() -> None:
            requests = []
            if method == "broadcast" and dst.layout == "replicate":
                roots = {t.tile: t.src for t in transfers}  # one broadcast a tile
                for tile, source in roots.items():
                    if rank == source or rank >= src.ranks:
                        piece = whole[tile * tile_elements : (tile + 1) * tile_elements]
                        group = self.groups["broadcast"][source]
                        requests.append(
                            dist.broadcast(piece, src=source, group=group, async_op=True)
                        )
            else:
                for t in transfers:
                    piece = whole[t.tile * tile_elements : (t.tile + 1) * tile_elements]
                    if rank == t.src:
                        requests.append(dist.isend(piece, dst=src.ranks + t.dst))
                    elif rank == src.ranks + t.dst:
                        requests.append(dist.irecv(piece, src=t.src))
            for request in requests:
                request.wait()
            if gather and rank >= src.ranks:
                part = elements // dst.ranks
                mine = rank - src.ranks
                dist.all_gather_into_tensor(
                    gathered, whole[mine * part : (mine + 1) * part], group=self.groups["dst"]
                )

        return Move(run, whole, gathered if gather else whole)

    def check(self, method: str, move: Move) -> None:
        """Run ``move`` once with the sources holding ``0 .. n-1`` and the destinations
        zeros; raise unless every destination rank then holds what its layout says."""
        whole, result, elements = move.whole, move.result, move.whole.numel()
        expected = torch.arange(elements, dtype=torch.float32)
        if self.rank < self.src.ranks:
            whole.copy_(expected)
        else:
            whole.zero_()
            result.zero_()
        move.run()
        if self.rank < self.src.ranks:
            return
        mine = self.rank - self.src.ranks
        if self.dst.layout == "shard":
            part = elements // self.dst.ranks
            region = slice(mine * part, (mine + 1) * part)
        else:
            region = slice(0, elements)
        if not torch.equal(result[region], expected[region]):
            raise RuntimeError(f"{method}: destination rank {mine} received the wrong values")


def _time(runs: dict[str, Callable[[], None]], warmup: int, repeats: int) -> dict[str, list]:
    """Per method, each repeat's slowest-rank time (us); methods alternate their order."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    local: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            dist.barrier()
            start = time.perf_counter()
            runs[name]()
            local[name].append((time.perf_counter() - start) * 1e6)
    out = {}
    for name in names:
        slowest = torch.tensor(local[name], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[name] = [float(t) for t in slowest]
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    die_with_parent()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    src, dst = MeshLayout.parse(args.src), MeshLayout.parse(args.dst)
    if src.ranks + dst.ranks != world_size:
        print(f"the meshes need {src.ranks + dst.ranks} ranks, got {world_size}", file=sys.stderr)
        return 2
    process_groups.join("gloo", args.timeout_s)
    destination = list(range(src.ranks, world_size))
    # Every rank makes every group, in the same order.
    groups: dict[str, Any] = {
        "dst": process_groups.subgroup(destination) if dst.ranks > 1 else None
    }
    groups["broadcast"] = {i: process_groups.subgroup([i, *destination]) for i in range(src.ranks)}
    mover = Mover(rank, src, dst, groups)
    samples = []
    for size in (int(s) for s in args.sizes.split(",")):
        lcm_parts = src.ranks * dst.ranks
        elements = max(lcm_parts, size // _ELEMENT_BYTES // lcm_parts * lcm_parts)
        runs = {}
        for method in args.methods.split(","):
            move = mover.operation(method, elements)
            mover.check(method, move)
            runs[method] = move.run
        timed = _time(runs, args.warmup, args.repeats)
        for method, times in timed.items():
            samples.append(
                {"method": method, "size_bytes": elements * _ELEMENT_BYTES, "times_us": times}
            )
            if rank == 0:
                median = sorted(times)[len(times) // 2] / 1e3
                print(f"{method} {elements * _ELEMENT_BYTES} B: {median:.3f} ms", flush=True)
    if rank == 0:
        partial = args.output.with_name(args.output.name + ".partial")
        partial.write_text(
            json.dumps({"samples": samples, "src": args.src, "dst": args.dst}), "utf-8"
        )
        os.replace(partial, args.output)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    freeze_for_exit()
    sys.exit(code)
