"""The cost model's synthetic datasets, built once a session for every test that prices them."""

import pytest

from ddlsim.simulator.dataset import Dataset
from tests.simulator.synthetic import two_model_dataset, with_truth


@pytest.fixture(scope="session")
def two_models() -> Dataset:
    """The mlp's and gpt2-tiny's runs, gpt2-tiny's parallel plans among them."""
    return two_model_dataset()


@pytest.fixture(scope="session")
def synthetic(two_models: Dataset) -> Dataset:
    """``two_models`` with measured times that differ from the replay (``with_truth``)."""
    return with_truth(two_models)
