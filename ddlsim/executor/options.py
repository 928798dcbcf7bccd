"""``RunOptions``: how the executor runs a strategy (ranks, link, device, the measurement
protocol's settings, seed, optimizer, limits), checked on construction."""

import dataclasses

import torch

from ddlsim.cluster import MAX_WORLD_SIZE
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.cluster import BACKENDS
from ddlsim.executor.context import OPTIMIZERS
from ddlsim.executor.protocol import StoppingRule

DEVICES: tuple[str, ...] = ("cpu", "cuda")
# The measurement protocol's defaults have one home: the stopping rule's.
_PROTOCOL_DEFAULTS = StoppingRule()


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class RunOptions:
    """How to run: ranks, link, the measurement protocol's settings, seed, optimizer, limits.

    The protocol (``executor.protocol``): at least ``warmup`` warm-up steps, more until the
    step time is stable (at most ``max_warmup``); at least ``iters`` samples (a turn: side by
    side, every strategy takes turns of ``iters`` steps), then more turns until the median's
    95 % interval is within ``±ci_target`` of it, ``budget_s`` seconds a strategy are spent
    beyond the minimums, or ``max_iters`` samples are reached. ``budget_s`` 0 runs exactly the
    minimums. ``pin`` pins rank ``r`` to core ``r % cores``.

    ``bandwidth`` ``None`` runs the ranks on loopback; a rate (``"1gbit"``) or ``"none"`` on an
    emulated cluster. ``timeout_s`` bounds the whole launch; a collective that waits longer than
    ``collective_timeout_s`` (a hung rank) fails its rank. ``device`` ``"cuda"`` puts rank ``r``
    on GPU ``r`` of this machine; ``backend`` defaults to NCCL there and to gloo on the CPU
    (gloo also takes CUDA tensors, and then lets several ranks share one GPU).
    """

    world_size: int = 1
    bandwidth: str | None = None
    device: str = "cpu"
    backend: str | None = None
    iters: int = _PROTOCOL_DEFAULTS.min_samples
    warmup: int = _PROTOCOL_DEFAULTS.warmup
    max_warmup: int = _PROTOCOL_DEFAULTS.max_warmup
    max_iters: int = _PROTOCOL_DEFAULTS.max_iters
    ci_target: float = _PROTOCOL_DEFAULTS.ci_target
    budget_s: float = _PROTOCOL_DEFAULTS.budget_s
    pin: bool = True
    seed: int = 0
    optimizer: str = "adamw"
    dropout: bool = False
    timeout_s: float = 1800.0
    collective_timeout_s: float = 300.0
    # One more step after the measured ones, profiled on rank 0: RunResult.trace.
    trace: bool = False
    # On the CPU, each rank's peak memory as its allocator reports it (profiling the build and
    # the first steps: executor.memory_profile) instead of the process's resident set.
    memory_profile: bool = False

    def __post_init__(self) -> None:
        for name, low in (("world_size", 1), ("iters", 1), ("warmup", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidOptionError(f"{name}({value!r}) must be an integer >= {low}")
        self.rule(rounds=1)  # checks the protocol's settings
        if self.world_size > MAX_WORLD_SIZE:
            raise InvalidOptionError(
                f"world_size({self.world_size}) is out of range; allowed: 1 to {MAX_WORLD_SIZE}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise InvalidOptionError(
                f"optimizer {self.optimizer!r} is not supported; allowed: {', '.join(OPTIMIZERS)}"
            )
        for name in ("timeout_s", "collective_timeout_s"):
            if not getattr(self, name) > 0:
                raise InvalidOptionError(f"{name}({getattr(self, name)}) must be > 0")
        if self.device not in DEVICES:
            raise InvalidOptionError(
                f"device {self.device!r} is not supported; allowed: {', '.join(DEVICES)}"
            )
        if self.backend is not None and self.backend not in BACKENDS:
            raise InvalidOptionError(
                f"backend {self.backend!r} is not supported; allowed: {', '.join(BACKENDS)}"
            )
        if self.backend == "nccl" and self.device != "cuda":
            raise InvalidOptionError(
                f"backend 'nccl' needs device 'cuda', got device {self.device!r}"
            )

    def rule(self, *, rounds: int) -> StoppingRule:
        """The stopping rule of a launch whose strategies take at least ``rounds`` turns."""
        return StoppingRule(
            warmup=self.warmup,
            max_warmup=max(self.max_warmup, self.warmup),
            min_samples=self.iters * rounds,
            max_iters=max(self.max_iters, self.iters * rounds),
            ci_target=self.ci_target,
            budget_s=self.budget_s,
        )

    @property
    def resolved_backend(self) -> str:
        """The process group's backend: as given, else NCCL on CUDA and gloo on the CPU."""
        if self.backend is not None:
            return self.backend
        return "nccl" if self.device == "cuda" else "gloo"

    def check_devices(self, *, ranks_here: int | None = None) -> None:
        """Refuse a CUDA run this machine cannot host, before any rank starts; ``ranks_here``
        is how many of the ranks run on this machine (default: all of them; under an external
        launcher, this node's).

        Raises:
            InvalidOptionError: no CUDA device, or fewer GPUs than NCCL ranks (NCCL refuses two
                ranks on one GPU).
        """
        if self.device != "cuda":
            return
        if not torch.cuda.is_available():
            raise InvalidOptionError(
                "device 'cuda' was asked for but torch sees no CUDA device; use device 'cpu'"
            )
        count = torch.cuda.device_count()
        here = self.world_size if ranks_here is None else ranks_here
        if self.world_size > 1 and self.resolved_backend == "nccl" and count < here:
            ranks = f"world_size({here})" if ranks_here is None else f"{here} rank(s) of this node"
            raise InvalidOptionError(
                f"backend 'nccl' needs one GPU per rank: {ranks} > {count} GPU(s) here; use "
                "fewer ranks, or backend 'gloo' to share GPUs"
            )
