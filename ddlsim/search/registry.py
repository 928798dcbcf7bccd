"""The search algorithms by name, and the one way to get one."""

from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.search.algorithm import SearchAlgorithm
from ddlsim.search.autotune import Autotune
from ddlsim.search.backtrack import Backtrack
from ddlsim.search.optuna_search import CmaEsSearch, Nsga2Search, OptunaSearch, TpeSearch
from ddlsim.search.random_search import RandomSearch

ALGORITHMS: dict[str, type[SearchAlgorithm]] = {
    cls.name: cls
    for cls in (Backtrack, TpeSearch, CmaEsSearch, Nsga2Search, RandomSearch, Autotune)
}
"""Every search algorithm by its name (``ddlsim search --algo``)."""

STUDY_ALGORITHMS: tuple[str, ...] = tuple(
    name for name, cls in ALGORITHMS.items() if issubclass(cls, OptunaSearch)
)
"""The algorithms that keep an Optuna study, which several worker processes can share."""


def search_algorithm(name: str, **config: Any) -> SearchAlgorithm:
    """The algorithm called ``name``, built with ``config`` (its constructor's keywords: an
    Optuna algorithm's ``storage``, ``study_name`` and ``helpers``, backtracking's ``slack``,
    autotune's ``max_runs``).

    Raises:
        InvalidOptionError: an unknown name (the message lists the choices).
        TypeError: a keyword the algorithm does not take.
    """
    if name not in ALGORITHMS:
        raise InvalidOptionError(
            f"search algorithm {name!r} is not one of {', '.join(ALGORITHMS)}"
        )
    return ALGORITHMS[name](**config)
