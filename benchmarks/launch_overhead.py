"""What starting ranks costs on the emulated cluster: each host's rank started directly (with
torchrun's worker variables, as ``EmulatedCluster`` does) against the same rank under a torchrun
agent of its own on each host (``--nnodes N --node-rank i --nproc-per-node 1``, how the cluster
started ranks before 2026-11-28), side by side: the two alternate, one launch each a round.

Each launch runs ``ddlsim.profiler.collective_rank`` on every host (one 64 KiB all-reduce, one
repeat: almost nothing but the start, the rendezvous and the end). For each: the launch's wall
time and the CPU time of every process it started (user + system, from the children's resource
usage: the launcher waits for each rank or agent, and an agent for its rank). Medians with their
95 % intervals, and the ratio of medians with its bootstrap interval over whole rounds.

    .venv/bin/python benchmarks/launch_overhead.py --rounds 12 --world-size 2 --json launch.json
"""

import argparse
import contextlib
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddlsim.cluster import EmulatedCluster
from ddlsim.cluster import emulated as cluster_launch
from ddlsim.cluster import host as cluster_host
from ddlsim.executor.protocol import median_interval, ratio_interval

MODULE = "ddlsim.profiler.collective_rank"
STARTS = ("direct", "torchrun agent")


def _agent_start_rank(**kwargs: Any) -> Any:
    """``host.start_rank`` with ``python -m torch.distributed.run ... -m MODULE`` in place of
    ``python -m MODULE`` (the variables it sets are torchrun's to set, and it sets them)."""
    rank, world = kwargs["rank"], kwargs["world_size"]
    args = ["--nnodes", str(world), "--node-rank", str(rank), "--nproc-per-node", "1"]
    args += ["--max-restarts", "0", "--master-addr", kwargs["master_address"]]
    args += ["--master-port", str(kwargs["master_port"]), "-m", kwargs["module"]]
    kwargs["args"] = [*args, *kwargs["args"]]
    kwargs["module"] = "torch.distributed.run"
    return cluster_host.start_rank(**kwargs)


@contextlib.contextmanager
def _starting(how: str) -> Iterator[None]:
    if how == "direct":
        yield
        return
    cluster_launch.start_rank = _agent_start_rank
    try:
        yield
    finally:
        cluster_launch.start_rank = cluster_host.start_rank


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_launch(cluster: EmulatedCluster, how: str, out: Path) -> tuple[float, float]:
    """One launch started ``how``: its wall and CPU seconds."""
    args = ["--backend", "gloo", "--sizes", "65536", "--collectives", "all_reduce"]
    args += ["--repeats", "1", "--warmup", "0", "--output", str(out)]
    cpu = _children_cpu_s()
    start = time.perf_counter()
    with _starting(how):
        cluster.launch(MODULE, args, timeout_s=300, output_paths=[out])
    return time.perf_counter() - start, _children_cpu_s() - cpu


def summary(samples: dict[str, list[float]], rounds: list[int]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for how in STARTS:
        low, high = median_interval(samples[how])
        row[how] = {"median": statistics.median(samples[how]), "ci95": [low, high]}
    direct, agent = samples["direct"], samples["torchrun agent"]
    row["ratio_direct_over_agent"] = statistics.median(direct) / statistics.median(agent)
    row["ratio_ci95"] = list(
        ratio_interval(direct, agent, numerator_rounds=rounds, denominator_rounds=rounds)
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--json", type=Path, help="write the samples and the summary here")
    args = parser.parse_args()
    wall: dict[str, list[float]] = {how: [] for how in STARTS}
    cpu: dict[str, list[float]] = {how: [] for how in STARTS}
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmulatedCluster(args.world_size, args.bandwidth) as cluster,
    ):
        one_launch(cluster, "direct", Path(tmp) / "warm.json")  # warm the page cache
        for index in range(args.rounds):
            # alternate which goes first, so that neither always follows the other
            order = STARTS if index % 2 == 0 else STARTS[::-1]
            for how in order:
                w, c = one_launch(cluster, how, Path(tmp) / "out.json")
                wall[how].append(w)
                cpu[how].append(c)
            said = [f"{h} {wall[h][-1]:.2f} s wall, {cpu[h][-1]:.2f} s CPU" for h in STARTS]
            print(f"round {index + 1}: " + ", ".join(said), file=sys.stderr)
    rounds = list(range(args.rounds))
    result = {
        "world_size": args.world_size,
        "bandwidth": args.bandwidth,
        "rounds": args.rounds,
        "network": cluster.network,
        "wall_s": summary(wall, rounds),
        "cpu_s": summary(cpu, rounds),
        "samples": {"wall_s": wall, "cpu_s": cpu},
    }
    for name in ("wall_s", "cpu_s"):
        row = result[name]
        print(
            f"{name}: direct {row['direct']['median']:.2f} "
            f"[{row['direct']['ci95'][0]:.2f}, {row['direct']['ci95'][1]:.2f}], "
            f"torchrun agent {row['torchrun agent']['median']:.2f} "
            f"[{row['torchrun agent']['ci95'][0]:.2f}, {row['torchrun agent']['ci95'][1]:.2f}]; "
            f"direct / agent {row['ratio_direct_over_agent']:.3f} "
            f"[{row['ratio_ci95'][0]:.3f}, {row['ratio_ci95'][1]:.3f}]"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
