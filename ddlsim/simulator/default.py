"""Which cost model ``ddlsim predict`` uses: the user's trained one, else the one shipped.

``ddlsim simulator train`` writes to the user's data directory; the repository ships a
checkpoint trained on the shipped dataset (``data/simulator/cost_model.pt``), so prediction
works right after install. The checkpoint's meta names the predictor held-out evaluation chose
(``replay``, ``gnn`` or ``blend``).
"""

import os
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs

from ddlsim.simulator.gnn import IterationCostModel
from ddlsim.simulator.train import load_checkpoint

SHIPPED_DATASET = "cpu-v2.json.gz"


def shipped_checkpoint() -> Path:
    return Path(str(resources.files("ddlsim.data") / "simulator" / "cost_model.pt"))


def shipped_dataset() -> Path:
    return Path(str(resources.files("ddlsim.data") / "datasets" / SHIPPED_DATASET))


def user_checkpoint() -> Path:
    """Where ``ddlsim simulator train`` writes: ``$DDLSIM_DATA_DIR`` (else the user's data
    directory) ``/simulator/cost_model.pt``."""
    root = os.environ.get("DDLSIM_DATA_DIR") or platformdirs.user_data_dir("ddlsim")
    return Path(root) / "simulator" / "cost_model.pt"


def default_checkpoint() -> Path:
    """The user's trained checkpoint if there is one, else the shipped one."""
    user = user_checkpoint()
    return user if user.is_file() else shipped_checkpoint()


def load_default(path: Path | None = None) -> tuple[IterationCostModel, dict[str, Any]] | None:
    """The cost model at ``path`` (default: :func:`default_checkpoint`), or ``None`` when no
    checkpoint exists there.

    Raises:
        InvalidOptionError: the file exists but is not a cost-model checkpoint.
    """
    chosen = path or default_checkpoint()
    if not chosen.is_file():
        return None
    return load_checkpoint(chosen)
