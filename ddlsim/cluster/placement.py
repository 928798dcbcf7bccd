"""Where each rank runs: the core a launch pins it to, and the placement it reports back.

A launch tells each rank, in ``DDLSIM_PLACEMENT_PATH``, where to write its placement; a rank
that calls :func:`report_placement` late in its run leaves there the cores it was allowed on and
the core it last ran on, and the launcher reads them back with :func:`read_placements`.
"""

import dataclasses
import json
import os
from pathlib import Path

PLACEMENT_ENV = "DDLSIM_PLACEMENT_PATH"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankPlacement:
    """Where a rank ran: the cores it was allowed on and the core it last ran on."""

    rank: int
    allowed_cores: tuple[int, ...]
    last_core: int


def report_placement() -> RankPlacement:
    """Called by a rank: read its placement and, under a launch, write it for the launcher.

    The core it last ran on is field 39 of ``/proc/self/stat``; call this late in the run.
    """
    rank = int(os.environ.get("RANK", "0"))
    with open("/proc/self/stat", encoding="ascii") as stat:
        # The command name (field 2) may hold spaces; count fields after its closing paren.
        fields = stat.read().rsplit(")", 1)[1].split()
    placement = RankPlacement(
        rank=rank,
        allowed_cores=tuple(sorted(os.sched_getaffinity(0))),
        last_core=int(fields[39 - 3]),
    )
    path = os.environ.get(PLACEMENT_ENV)
    if path:
        Path(path).write_text(json.dumps(dataclasses.asdict(placement)), encoding="utf-8")
    return placement


def pinned_cores(world_size: int, *, pin: bool) -> list[int | None]:
    """The core each rank is pinned to: rank ``i`` on the ``i % n``-th of the cores this
    process may use, or ``None`` for every rank when ``pin`` is off."""
    if not pin:
        return [None] * world_size
    cores = sorted(os.sched_getaffinity(0))
    return [cores[rank % len(cores)] for rank in range(world_size)]


def placement_path(launch_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` of the launch in ``launch_dir`` writes its placement."""
    return launch_dir / f"placement{rank}.json"


def read_placements(
    launch_dir: Path, world_size: int
) -> tuple[dict[int, list[int]], dict[int, int]]:
    """The allowed cores and the last core of each rank that reported its placement (ranks
    that did not are left out of both)."""
    rank_cores: dict[int, list[int]] = {}
    last_cores: dict[int, int] = {}
    for rank in range(world_size):
        path = placement_path(launch_dir, rank)
        if path.exists():
            raw = json.loads(path.read_text(encoding="utf-8"))
            rank_cores[rank] = list(raw["allowed_cores"])
            last_cores[rank] = int(raw["last_core"])
    return rank_cores, last_cores
