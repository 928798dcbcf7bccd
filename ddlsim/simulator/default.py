"""Where the cost model's checkpoints and the shipped dataset are: the user's trained
checkpoint, else the one shipped.

``ddlsim simulator train`` writes to the user's data directory; the repository ships a
checkpoint trained on the shipped dataset (``data/simulator/cost_model.pt``), so prediction
works right after install. The checkpoint's meta names the predictor held-out evaluation chose
(``replay``, ``gnn`` or ``blend``); :func:`simulator.cost_model.load_cost_model` reads it.
"""

import os
from importlib import resources
from pathlib import Path

import platformdirs

SHIPPED_DATASET = "cpu-v3.json.gz"


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
