"""Helpers shared by the commands: number formatting, JSON output, progress lines."""

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.workflows.requests import MeasureSettings, Progress

Request = TypeVar("Request")
Outcome = TypeVar("Outcome")


def _integer_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= {low}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _integer_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _integer_at_least(text, 0)


def emit_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def human(value: float, unit: str) -> str:
    """Decimal prefixes (FLOPs, counts): ``1.23 GFLOP``."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def human_bytes(value: float) -> str:
    """Binary prefixes, as bucket caps are given (MiB)."""
    for scale, prefix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}B"
    return f"{value:.0f} B"


def progress(message: str) -> None:
    """A status line on a terminal (never in pipes or --json output)."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def nonnegative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1), e.g. 0.01")
    return value


def stderr_progress(fraction: float | None, message: str) -> None:
    """A workflow's progress as status lines on a terminal (:func:`progress`)."""
    progress(message)


def model_argument(args: argparse.Namespace) -> ModelSpec:
    """The ``MODEL`` argument (zoo name, spec file or inline JSON) at the inputs of
    ``--batch-size``, ``--seq-len`` and ``--image-size``."""
    return resolve_model(args.model).with_inputs(
        batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size
    )


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """``MODEL`` and the inputs that override its own (:func:`model_argument`)."""
    parser.add_argument("model", metavar="MODEL", help="zoo name, spec file or inline JSON")
    parser.add_argument("--batch-size", type=positive_int, help="global batch size")
    parser.add_argument("--seq-len", type=positive_int)
    parser.add_argument("--image-size", type=positive_int)


def add_launch_arguments(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any],
    bandwidth_help: str,
    *,
    side_by_side: bool = False,
) -> None:
    """``--strategy``, ``--world-size`` and ``--bandwidth`` (:func:`strategy_argument` reads the
    strategy), with the use case's ``defaults`` (``world_size``, ``bandwidth``);
    ``bandwidth_help`` says what the link is for. With ``side_by_side`` ``--strategy`` may be
    given more than once (:func:`strategy_arguments` reads them)."""
    if side_by_side:
        parser.add_argument(
            "--strategy",
            action="append",
            help="strategy JSON or file (default: PyTorch DDP's defaults); given more than "
            "once, the strategies run side by side in one launch, taking turns",
        )
    else:
        parser.add_argument(
            "--strategy", help="strategy JSON or file (default: PyTorch DDP's defaults)"
        )
    parser.add_argument("--world-size", type=positive_int, default=defaults["world_size"])
    parser.add_argument("--bandwidth", default=defaults["bandwidth"], help=bandwidth_help)


def strategy_argument(args: argparse.Namespace) -> Strategy:
    """The ``--strategy`` option (inline JSON or a file), else DDP's defaults."""
    return Strategy.parse(args.strategy) if args.strategy else Strategy()


def strategy_arguments(args: argparse.Namespace) -> list[Strategy]:
    """Every ``--strategy`` given (inline JSON or a file), each once, in the order given; DDP's
    defaults when none is."""
    strategies: list[Strategy] = []
    for raw in args.strategy or [None]:
        strategy = Strategy.parse(raw) if raw else Strategy()
        if strategy not in strategies:
            strategies.append(strategy)
    return strategies


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--db`` (the store's URL) and ``--json`` (print JSON), as every command that reads or
    writes the store takes them."""
    parser.add_argument("--db", help="store URL (default: $DDLSIM_DB or the user data dir)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_simulator_argument(parser: argparse.ArgumentParser) -> None:
    """``--simulator``: the cost model a command predicts with (``replay`` alone or a
    checkpoint; default: the user's trained one, else the shipped one)."""
    parser.add_argument(
        "--simulator",
        metavar="replay|analytic|CKPT",
        help="'replay' alone, 'analytic' (closed form of grid plans), or a cost-model "
        "checkpoint (default: yours if trained, else the shipped one); with --cluster, "
        "'replay' or a checkpoint trained on GPU iterations (simulator train --gpu; default: "
        "yours where trained over the cluster's GPU, else replay)",
    )


def add_prediction_arguments(parser: argparse.ArgumentParser, *, profile_iters: int) -> None:
    """How a command predicts: its cost model (:func:`add_simulator_argument`) and the
    iterations of the kernel profile it takes of a micro-batch the store has none of."""
    parser.add_argument(
        "--profile-iters",
        type=positive_int,
        default=profile_iters,
        help="iterations of the kernel profile taken when none is stored",
    )
    add_simulator_argument(parser)


def add_protocol_arguments(
    parser: argparse.ArgumentParser,
    *,
    defaults: MeasureSettings = MeasureSettings(),  # noqa: B008 - frozen, shared on purpose
    what: str = "",
) -> None:
    """The measurement protocol's options (``executor.protocol``), the same on every command
    that measures training, with the use case's ``defaults``; ``what`` names the part of the
    command they apply to."""
    prefix = f"{what}: " if what else ""
    # (flag, the option's name, its type, its default, what it asks for)
    options: tuple[tuple[str, str, Callable[[str], Any], Any, str], ...] = (
        (
            "--iters",
            "iters",
            positive_int,
            defaults.iters,
            "at least this many measured steps (a turn, side by side), more until --ci or "
            "--measure-budget",
        ),
        (
            "--warmup",
            "warmup",
            int,
            defaults.warmup,
            "at least this many warm-up steps, more until the step time is stable",
        ),
        (
            "--ci",
            "ci_target",
            fraction,
            defaults.ci_target,
            "measure until the median's 95 %% interval is within +- this fraction of it "
            f"(default {defaults.ci_target:g})",
        ),
        (
            "--measure-budget",
            "measure_budget_s",
            nonnegative_float,
            defaults.budget_s,
            f"seconds a strategy may measure beyond the minimums (default "
            f"{defaults.budget_s:g}; 0: exactly --iters and --warmup)",
        ),
    )
    for flag, dest, kind, default, asks in options:
        parser.add_argument(flag, dest=dest, type=kind, default=default, help=prefix + asks)


def measure_settings(args: argparse.Namespace) -> MeasureSettings:
    """The protocol's settings from ``add_protocol_arguments``'s options."""
    return MeasureSettings(
        iters=args.iters,
        warmup=args.warmup,
        ci_target=args.ci_target,
        budget_s=args.measure_budget_s,
    )


def request_from(
    args: argparse.Namespace,
    request_type: type[Request],
    /,
    *,
    renames: Mapping[str, str] | None = None,
    **given: Any,
) -> Request:
    """A request (or options) dataclass from a command's parsed options: each field the command
    has an option for (the option named like the field, or ``renames[field]``; a ``model``
    field from ``MODEL`` and the input options, :func:`model_argument`), unless ``given``; the
    request's own defaults for the rest. Construction validates it.

    Raises:
        DdlsimError: a value the request refuses (its message names it).
    """
    named = renames or {}
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(request_type):  # type: ignore[arg-type]
        option = named.get(field.name, field.name)
        if field.name in given or not hasattr(args, option):
            continue
        fields[field.name] = (
            model_argument(args) if field.name == "model" else getattr(args, option)
        )
    return request_type(**fields, **given)


def run_on_store(
    args: argparse.Namespace,
    use_case: Callable[[Request, Store, Progress], Outcome],
    request: Request,
) -> Outcome:
    """Run a use case on the store of ``--db``, its progress as status lines on a terminal."""
    with Store.open(args.db) as store:
        return use_case(request, store, stderr_progress)


def format_interval(interval: Any, unit: str = " ms") -> str:
    """``[low, high]`` as ``low-high`` with the unit (``-`` for none)."""
    if not interval:
        return "-"
    low, high = interval
    return f"{low:.1f}-{high:.1f}{unit}"


def verification_lines(verified: Any) -> list[str]:
    """A person's reading of a search's ``--verify`` fields: each measured median with its
    interval, then what the measurement decided (``answer``) in plain words."""

    def timed(name: str) -> str:
        ms = verified.get(f"measured_{name}_ms")
        if ms is None:
            return "not run"
        ci = format_interval(verified.get(f"measured_{name}_ci95_ms"))
        return f"{ms:.1f} ms (95 % interval {ci})"

    if verified.get("kept_baseline"):
        lines = [f"DDP's defaults {timed('baseline')}"]
    else:
        lines = [f"pick {timed('best')}, DDP's defaults {timed('baseline')}"]
    if verified.get("answer"):
        lines.append(str(verified["answer"]))
    return lines


def describe(strategy: dict[str, Any]) -> str:
    """One line of a strategy's JSON (:meth:`Strategy.describe`)."""
    return Strategy.from_dict(strategy).describe()


def add_launcher_arguments(
    parser: argparse.ArgumentParser, *, what: str, joins: bool = True
) -> None:
    """``--launcher local|env|slurm`` (``joins`` false: no ``env``, for a process that is not
    a rank, such as a worker) and the Slurm job's settings (:func:`slurm_settings`)."""
    from ddlsim.cluster.launcher import LAUNCHERS
    from ddlsim.cluster.slurm import SUBMITIT_CLUSTERS

    env = (
        "env: join the process group torchrun, srun or a PyTorchJob made (RANK, WORLD_SIZE, "
        "LOCAL_RANK, MASTER_ADDR, MASTER_PORT; cuda:LOCAL_RANK with NCCL); "
    )
    parser.add_argument(
        "--launcher",
        choices=[name for name in LAUNCHERS if joins or name != "env"],
        default="local",
        help=f"where {what} runs. local: this machine's emulated cluster (default); "
        f"{env if joins else ''}slurm: submit env ranks as a Slurm job with submitit and wait",
    )
    slurm = parser.add_argument_group("--launcher slurm")
    slurm.add_argument("--nodes", type=int, default=1, help="nodes of the job (default 1)")
    slurm.add_argument(
        "--gpus-per-node", type=int, default=1, help="ranks per node, one GPU each on cuda"
    )
    slurm.add_argument("--partition", help="the Slurm partition (default: the cluster's)")
    slurm.add_argument(
        "--time", type=int, default=60, help="the job's time limit, minutes (default 60)"
    )
    slurm.add_argument(
        "--slurm-folder", help="submitit's job files (default: ./ddlsim-slurm/JOB_ID)"
    )
    slurm.add_argument(
        "--submitit-cluster",
        choices=SUBMITIT_CLUSTERS,
        default="slurm",
        help="slurm, or local: submitit's local executor runs the job on this machine",
    )


def slurm_settings(args: argparse.Namespace) -> Any:
    """The ``SlurmSettings`` of :func:`add_launcher_arguments`'s options (checked)."""
    from ddlsim.cluster.slurm import SlurmSettings

    return SlurmSettings(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        partition=args.partition,
        time_min=args.time,
        folder=args.slurm_folder,
        cluster=args.submitit_cluster,
    )


def launcher_from(args: argparse.Namespace) -> Any:
    """The ``Launcher`` :func:`add_launcher_arguments`'s options choose (checked)."""
    from ddlsim.cluster.launcher import launcher_for

    return launcher_for(args.launcher, slurm=slurm_settings(args))


def slurm_job_printer(extra: dict[str, Any]) -> Any:
    """An ``on_submit`` that prints the Slurm job's id and keeps it in ``extra``."""

    def submitted(job_id: str) -> None:
        extra["slurm_job_id"] = job_id
        print(f"ddlsim: Slurm job {job_id}", file=sys.stderr, flush=True)

    return submitted
