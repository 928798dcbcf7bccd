"""The simulator's measured dataset: what it holds, the batch file that measures it, its file.

The models (:mod:`.models`) and the strategies tried on each (:mod:`.pools`) make a plan, an
ordinary ``ddlsim profile batch`` file (:mod:`.plan`); what the batch measured is exported from
its store into one self-contained gzip JSON file (:mod:`.export`, :mod:`.json_file`) that holds
a :class:`Dataset` (:mod:`.entries`). :func:`load_dataset` reads it back.
"""

from ddlsim.data.comm_model import LinkFit
from ddlsim.simulator.dataset.entries import Dataset, FusionEntry, KernelEntry, RunEntry, spec_key
from ddlsim.simulator.dataset.export import (
    add_session,
    export_dataset,
    merge_datasets,
    with_references,
)
from ddlsim.simulator.dataset.json_file import DATASET_FORMAT, load_dataset, save_dataset
from ddlsim.simulator.dataset.models import (
    DATASET_VERSIONS,
    dataset_models,
    dataset_models_v3,
    models_of,
)
from ddlsim.simulator.dataset.plan import (
    LINK_COLLECTIVES,
    LINK_SIZES,
    PARALLEL_COLLECTIVES,
    SETTINGS,
    SETTINGS_V3,
    PlanOptions,
    drop_done,
    plan_jobs,
)
from ddlsim.simulator.dataset.pools import (
    FEATURES,
    grid_pool,
    interleaved_pool,
    layers_pool,
    mixed_pool,
    parallel_pool,
    plan_kind,
    strategy_pool,
)

__all__ = [
    "DATASET_FORMAT",
    "DATASET_VERSIONS",
    "FEATURES",
    "LINK_COLLECTIVES",
    "LINK_SIZES",
    "PARALLEL_COLLECTIVES",
    "SETTINGS",
    "SETTINGS_V3",
    "Dataset",
    "FusionEntry",
    "KernelEntry",
    "LinkFit",
    "PlanOptions",
    "RunEntry",
    "add_session",
    "dataset_models",
    "dataset_models_v3",
    "drop_done",
    "export_dataset",
    "grid_pool",
    "interleaved_pool",
    "layers_pool",
    "load_dataset",
    "merge_datasets",
    "mixed_pool",
    "models_of",
    "parallel_pool",
    "plan_jobs",
    "plan_kind",
    "save_dataset",
    "spec_key",
    "strategy_pool",
    "with_references",
]
