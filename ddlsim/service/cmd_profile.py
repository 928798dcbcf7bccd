"""``ddlsim profile kernels|fusion|collectives|batch``: measure models, compiled blocks and
links; store the results."""

import argparse
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ddlsim.data.resharding import MeshLayout
from ddlsim.data.store import (
    Store,
    add_fusion_profile,
    add_graph,
    add_kernel_profile,
    mask_url,
)
from ddlsim.profiler.batch import on_device, parse_batch
from ddlsim.profiler.batch_jobs import fusion_record, kernel_record
from ddlsim.profiler.capture import AUTOCAST
from ddlsim.profiler.collectives import COLLECTIVES, parse_sizes
from ddlsim.profiler.fusion import profile_fusion
from ddlsim.profiler.kernels import DEVICES, profile_kernels
from ddlsim.service.output import (
    add_launcher_arguments,
    add_store_arguments,
    emit_json,
    launcher_from,
    model_argument,
    non_negative_int,
    positive_int,
    progress,
    slurm_job_printer,
)
from ddlsim.workflows.clusters import CollectivesRequest, collect_collectives, describe
from ddlsim.workflows.profile import profile_batch
from ddlsim.workflows.resharding import reshard


def cmd_kernels(args: argparse.Namespace) -> int:
    spec = model_argument(args)
    with Store.open(args.db) as store:
        graph, profile = profile_kernels(
            spec,
            iters=args.iters,
            warmup=args.warmup,
            device=args.device,
            precision=args.precision,
            threads=args.threads,
            trace_dir=Path(args.trace_dir) if args.trace_dir else None,
            progress=progress,
        )
        with store.transaction() as session:
            add_graph(session, graph=graph)
            profile_id = add_kernel_profile(session, profile=kernel_record(profile))
    summary = {**profile.summary(), "id": profile_id, "db": mask_url(store.url)}
    if args.json:
        emit_json(summary)
    else:
        print(
            f"{profile.model} on {profile.device} ({profile.device_name}), {profile.iters} "
            f"iterations\n"
            f"  iteration    {profile.iteration_time_ms:.2f} ms median, profiler off\n"
            f"  attributed   {profile.attributed_ms:.2f} ms over {profile.num_nodes_timed} nodes "
            f"(coverage {profile.coverage:.3f})\n"
            f"  stored       kernel profile {profile_id} in {mask_url(store.url)}"
        )
        if profile.trace_path:
            print(f"  trace        {profile.trace_path} (open in Perfetto)")
    return 0


def cmd_fusion(args: argparse.Namespace) -> int:
    spec = model_argument(args)
    with Store.open(args.db) as store:
        graph, profile = profile_fusion(
            spec,
            args.blocks,
            iters=args.iters,
            warmup=args.warmup,
            threads=args.threads,
            progress=progress,
        )
        with store.transaction() as session:
            add_graph(session, graph=graph)
            profile_id = add_fusion_profile(session, profile=fusion_record(profile))
    if args.json:
        emit_json({**profile.to_json(), "id": profile_id, "db": mask_url(store.url)})
        return 0
    print(f"{profile.model}: blocks alone, forward and backward, median of {profile.iters}")
    print(f"  {'block':<32}{'eager':>10}{'compiled':>11}{'speed-up':>10}{'compile':>10}")
    for block in profile.blocks:
        print(
            f"  {block.block:<32}{block.eager_ms:>7.2f} ms{block.compiled_ms:>8.2f} ms"
            f"{block.speedup:>9.2f}x{block.compile_s:>8.1f} s"
        )
    print(f"  stored fusion profile {profile_id} in {mask_url(store.url)}")
    return 0


def cmd_collectives(args: argparse.Namespace) -> int:
    """On this machine's emulated cluster (``--launcher local``): one level, the links; under
    ``env`` or ``slurm``: each level of the real fabric. Rank 0 stores and prints."""
    request = CollectivesRequest(
        backend=args.backend,
        world_size=args.world_size,
        bandwidth=args.bandwidth,
        cpu_repeats=args.cpu_repeats,
        sizes=parse_sizes(args.sizes) if args.sizes else None,
        collectives=args.collectives,
        warmup=args.warmup,
        repeats=args.repeats,
        name=args.name,
        gpu=args.gpu,
    )
    launcher = launcher_from(args)
    extra: dict[str, Any] = {}
    done = collect_collectives(
        request,
        launcher=launcher,
        db=args.db,
        progress=progress,
        on_submit=slurm_job_printer(extra),
    )
    if done is None:
        return 0  # a rank that follows
    measured, ids, url = done
    if args.json:
        emit_json({**describe(measured), "ids": ids, "db": mask_url(url), **extra})
        return 0
    for level, profile in measured.profiles.items():
        print(
            f"{level}: {profile.world_size} ranks, {profile.backend}, link {profile.bandwidth}, "
            f"network {profile.network}"
        )
        print(f"  {'collective':<16}{'alpha':>12}{'busbw':>14}{'r2':>8}{'compute taken':>26}")
        for fit in profile.fits:
            print(
                f"  {fit.collective:<16}{fit.alpha_us:>9.0f} us{fit.busbw_gbps:>9.3f} Gb/s"
                f"{fit.r2:>8.3f}{fit.cpu_alpha_us:>9.0f} us + "
                f"{fit.cpu_us_per_byte * 2**20:>5.0f} us/MiB"
            )
        for note in profile.notes:
            print(f"  note: {note}")
    print(f"  stored {len(ids)} collective profiles in {mask_url(url)}")
    if measured.cluster is not None:
        print(
            f"stored cluster profile {measured.cluster.name!r}: use --cluster "
            f"{measured.cluster.name}[:NODES] with ddlsim predict and search"
        )
    return 0


def cmd_reshard(args: argparse.Namespace) -> int:
    src, dst = MeshLayout.parse(args.src), MeshLayout.parse(args.dst)
    sizes = parse_sizes(args.sizes)
    with Store.open(args.db) as store:
        rows = reshard(
            store,
            src,
            dst,
            sizes,
            bandwidth=args.bandwidth,
            warmup=args.warmup,
            repeats=args.repeats,
            progress=progress,
        )
    if args.json:
        emit_json({"src": args.src, "dst": args.dst, "bandwidth": args.bandwidth, "rows": rows})
        return 0
    print(f"{args.src} -> {args.dst} at {args.bandwidth}")
    print(f"  {'method':<20}{'size':>12}{'measured':>12}{'predicted':>12}{'error':>9}")
    for row in rows:
        print(
            f"  {row['method']:<20}{row['size_bytes']:>10} B{row['measured_ms']:>9.2f} ms"
            f"{row['predicted_ms']:>9.2f} ms{row['error'] * 100:>+8.1f}%"
        )
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    jobs = parse_batch(args.spec)
    if args.device is not None:
        jobs = on_device(jobs, args.device)
    with (
        Store.open(args.db) as store,
        tqdm(total=len(jobs), unit="job", disable=args.json, leave=False) as bar,
    ):

        def show(fraction: float | None, label: str) -> None:
            if fraction is None:  # a job starting: its label is shown with its position
                return
            bar.n = round(fraction * len(jobs))
            bar.set_description(label[:60])
            bar.refresh()

        trace_dir = Path(args.trace_dir) if args.trace_dir else None
        outcome = profile_batch(jobs, store, show, trace_dir=trace_dir)
    summary: dict[str, Any] = {**outcome.to_dict(), "jobs": len(jobs), "db": mask_url(store.url)}
    if args.json:
        emit_json(summary)
    else:
        print(
            f"{len(jobs)} jobs: {len(outcome.done)} done, {len(outcome.skipped)} already done, "
            f"{len(outcome.failed)} failed (stored in {mask_url(store.url)})"
        )
        for key, error in outcome.failed:
            print(f"  failed {key}: {error}")
    return 1 if outcome.failed else 0


def register(sub: Any) -> None:
    """Long: the declaration of every option of ``ddlsim profile``, one after another."""
    profile = sub.add_parser("profile", help="measure kernels and collectives, store them")
    kinds = profile.add_subparsers(dest="profile_command", required=True, metavar="KIND")

    kernels = kinds.add_parser(
        "kernels", help="time every node of a model's iteration graph on this machine"
    )
    kernels.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    kernels.add_argument("--iters", type=positive_int, default=20)
    kernels.add_argument("--warmup", type=int, default=3)
    kernels.add_argument("--device", choices=DEVICES, default="cpu")
    kernels.add_argument(
        "--precision",
        choices=list(AUTOCAST),
        default="fp32",
        help="bf16: the forward under autocast (weights fp32), the graph captured so",
    )
    kernels.add_argument(
        "--threads", type=positive_int, default=1, help="intra-op threads (default 1, as a rank)"
    )
    kernels.add_argument("--batch-size", type=positive_int)
    kernels.add_argument("--seq-len", type=positive_int)
    kernels.add_argument("--image-size", type=positive_int)
    kernels.add_argument("--trace-dir", help="write the Chrome trace (Perfetto) here")
    add_store_arguments(kernels)
    kernels.set_defaults(handler=cmd_kernels)

    fusion = kinds.add_parser(
        "fusion", help="time a model's blocks alone, eager and compiled (torch.compile)"
    )
    fusion.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    fusion.add_argument(
        "--blocks", nargs="+", metavar="PATH", help="module paths (default: the repeated blocks)"
    )
    fusion.add_argument("--iters", type=positive_int, default=10)
    fusion.add_argument("--warmup", type=int, default=2)
    fusion.add_argument(
        "--threads", type=positive_int, default=1, help="intra-op threads (default 1, as a rank)"
    )
    fusion.add_argument("--batch-size", type=positive_int)
    fusion.add_argument("--seq-len", type=positive_int)
    fusion.add_argument("--image-size", type=positive_int)
    add_store_arguments(fusion)
    fusion.set_defaults(handler=cmd_fusion)

    collectives = kinds.add_parser(
        "collectives",
        help="benchmark collectives between processes on an emulated cluster, fit alpha-beta",
    )
    collectives.add_argument(
        "--world-size", type=positive_int, help="ranks (--launcher local; else the launcher's)"
    )
    collectives.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (GPUs)")
    collectives.add_argument(
        "--bandwidth", default="1gbit", help="link rate per host: 1gbit, 100mbit, 10gbit, none"
    )
    collectives.add_argument(
        "--sizes", help="message sizes: a list (4KiB,1MiB) or a range (4KiB:256MiB, x4 steps)"
    )
    collectives.add_argument(
        "--collectives",
        nargs="+",
        default=list(COLLECTIVES),
        metavar="NAME",
        help=f"any of {', '.join(COLLECTIVES)}",
    )
    collectives.add_argument("--warmup", type=int, default=2)
    collectives.add_argument("--repeats", type=positive_int, default=5)
    collectives.add_argument(
        "--cpu-repeats",
        type=non_negative_int,
        default=5,
        help="times, per size, the compute each collective takes from its rank while in "
        "flight (what the replay charges to the rank's compute); 0 skips it",
    )
    add_launcher_arguments(collectives, what="the benchmark")
    collectives.add_argument(
        "--name",
        help="with --launcher env or slurm and NCCL: store the fabric as a cluster profile of "
        "this name, for ddlsim predict|search --cluster NAME[:NODES]",
    )
    collectives.add_argument(
        "--gpu", help="the preset whose GPU the cluster has (default: from the device's name)"
    )
    add_store_arguments(collectives)
    collectives.set_defaults(handler=cmd_collectives)

    resharding = kinds.add_parser(
        "reshard",
        help="move a tensor between two sub-meshes by each method, measured side by side and "
        "priced by the simulator",
    )
    resharding.add_argument("--src", required=True, help="RANKS:LAYOUT (shard or replicate)")
    resharding.add_argument("--dst", required=True, help="RANKS:LAYOUT (shard or replicate)")
    resharding.add_argument("--sizes", default="4MiB,16MiB,64MiB", help="tensor sizes")
    resharding.add_argument("--bandwidth", default="1gbit", help="link rate per host")
    resharding.add_argument("--warmup", type=non_negative_int, default=2)
    resharding.add_argument("--repeats", type=positive_int, default=7)
    add_store_arguments(resharding)
    resharding.set_defaults(handler=cmd_reshard)

    batch = kinds.add_parser("batch", help="run a YAML list or cross product of profile jobs")
    batch.add_argument("spec", metavar="SPEC.yaml")
    batch.add_argument("--trace-dir", help="write the kernel jobs' Chrome traces here")
    batch.add_argument(
        "--device",
        choices=DEVICES,
        help="run every kernels, run and compare job on this device (a GPU's own jobs: "
        "their keys in the store differ from the CPU's)",
    )
    add_store_arguments(batch)
    batch.set_defaults(handler=cmd_batch)
