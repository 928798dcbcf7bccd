"""Where the cost model's checkpoints and the shipped dataset are: the user's trained
checkpoint, else the one shipped.

``ddlsim simulator train`` writes to the user's data directory; the repository ships a
checkpoint trained on the shipped dataset (``data/simulator/cost_model.pt``), so prediction
works right after install. The checkpoint's meta names the predictor held-out evaluation chose
(``replay``, ``gnn`` or ``blend``); :func:`simulator.cost_model.load_cost_model` reads it.
"""

import dataclasses
import functools
import os
from importlib import resources
from pathlib import Path

import platformdirs

from ddlsim.simulator.dataset.json_file import read_part

SHIPPED_DATASET = "cpu-v3.json.gz"


def shipped_checkpoint() -> Path:
    return Path(str(resources.files("ddlsim.data") / "simulator" / "cost_model.pt"))


def shipped_dataset() -> Path:
    return Path(str(resources.files("ddlsim.data") / "datasets" / SHIPPED_DATASET))


def data_dir() -> Path:
    """The user's data directory: ``$DDLSIM_DATA_DIR``, else the platform's
    (``~/.local/share/ddlsim`` on Linux)."""
    return Path(os.environ.get("DDLSIM_DATA_DIR") or platformdirs.user_data_dir("ddlsim"))


def user_checkpoint() -> Path:
    """Where ``ddlsim simulator train`` writes: :func:`data_dir` ``/simulator/cost_model.pt``."""
    return data_dir() / "simulator" / "cost_model.pt"


def default_checkpoint() -> Path:
    """The user's trained checkpoint if there is one, else the shipped one."""
    user = user_checkpoint()
    return user if user.is_file() else shipped_checkpoint()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ShippedFit:
    """A gloo collective fit of the shipped dataset (this emulated cluster's links, measured
    when the dataset was collected), read where a store has no fit of a link."""

    collective: str
    world_size: int
    bandwidth: str
    alpha_us: float
    busbw_gbps: float
    cpu_alpha_us: float = 0.0
    cpu_us_per_byte: float = 0.0
    backend: str = "gloo"

    @property
    def source(self) -> str:
        return f"{self.collective} fit of the shipped dataset ({SHIPPED_DATASET})"


@functools.cache
def shipped_link_fits() -> tuple[ShippedFit, ...]:
    """The shipped dataset's own link fits (its sessions' are of the same links on other days).

    Read straight from the file's ``links``, which come before its kernels and runs: parsing
    the whole file takes seconds."""
    return tuple(
        ShippedFit(
            collective=str(entry["collective"]),
            world_size=int(entry["world_size"]),
            bandwidth=str(entry["bandwidth"]),
            alpha_us=float(entry["alpha_us"]),
            busbw_gbps=float(entry["busbw_gbps"]),
            cpu_alpha_us=float(entry.get("cpu_alpha_us", 0.0)),
            cpu_us_per_byte=float(entry.get("cpu_us_per_byte", 0.0)),
        )
        for entry in read_part(shipped_dataset(), "links")
    )
