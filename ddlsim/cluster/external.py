"""A process's place in a process group that an external launcher made (torchrun, srun, a
PyTorchJob): what every ``--launcher env`` command reads before it joins the group."""

import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ddlsim.data.errors import InvalidOptionError

ENV_KEYS: tuple[str, ...] = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExternalRank:
    """This process's place in a process group made by an external launcher."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "ExternalRank":
        """Read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (and
        ``LOCAL_WORLD_SIZE`` when set).

        Raises:
            InvalidOptionError: a variable missing or not a number, or a rank out of range.
        """
        env = os.environ if environ is None else environ
        missing = [key for key in ENV_KEYS if not env.get(key)]
        if missing:
            raise InvalidOptionError(
                f"--launcher env joins a process group that torchrun, srun or a PyTorchJob "
                f"made, but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                "set; start it under torchrun (or use --launcher local)"
            )
        numbers: dict[str, int] = {}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
            raw = env.get(key)
            if raw is None:
                continue
            try:
                numbers[key] = int(raw)
            except ValueError:
                raise InvalidOptionError(f"{key}={raw!r} is not an integer") from None
        world = numbers["WORLD_SIZE"]
        if world < 1 or not 0 <= numbers["RANK"] < world:
            raise InvalidOptionError(
                f"RANK({numbers['RANK']}) must be in 0..WORLD_SIZE({world}) - 1"
            )
        # srun sets no LOCAL_WORLD_SIZE; its tasks per node say the same (a plain count).
        per_node = env.get("SLURM_NTASKS_PER_NODE", "")
        fallback = int(per_node) if per_node.isdigit() else world
        local_world = numbers.get("LOCAL_WORLD_SIZE", fallback)
        if local_world < 1 or world % local_world:
            raise InvalidOptionError(
                f"LOCAL_WORLD_SIZE({local_world}) must divide WORLD_SIZE({world})"
            )
        return cls(
            rank=numbers["RANK"],
            world_size=world,
            local_rank=numbers["LOCAL_RANK"],
            local_world_size=local_world,
            master_addr=env["MASTER_ADDR"],
            master_port=numbers["MASTER_PORT"],
        )

    @property
    def nodes(self) -> int:
        return self.world_size // self.local_world_size

    def network(self, launcher: str, backend: str) -> str:
        """How the run's ranks were connected, for the stored measurement."""
        return (
            f"{launcher}: {self.nodes} node(s) x {self.local_world_size} rank(s), {backend} "
            f"rendezvous at {self.master_addr}:{self.master_port}"
        )


# How long the group's other ranks wait for rank 0 to say what runs (it may search first).
AGREE_TIMEOUT_S = 24 * 3600.0
_AGREED_KEY = "offer"


def launch_store(place: ExternalRank) -> Any:
    """The launch's key-value store at ``MASTER_ADDR:MASTER_PORT``, under a prefix of ours:
    torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE``), else rank 0 does, as
    ``init_process_group`` would. A process group may be joined over it."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        place.master_addr,
        place.master_port,
        place.world_size,
        is_master=place.rank == 0 and not agent,
        timeout=timedelta(seconds=AGREE_TIMEOUT_S),
        wait_for_workers=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"ddlsim/launch/{attempt}/", store)


def agree(store: Any, place: ExternalRank, offer: str | None) -> str:
    """What the group runs, as rank 0 says: rank 0 posts ``offer`` (a JSON text; ``""`` for
    nothing, so that the others end) and the others wait for it (up to ``AGREE_TIMEOUT_S``)
    and get it; ``offer`` is not read on them."""
    if place.rank == 0:
        store.set(_AGREED_KEY, offer or "")
    else:
        store.wait([_AGREED_KEY])
    agreed: bytes = store.get(_AGREED_KEY)
    return agreed.decode("utf-8")
