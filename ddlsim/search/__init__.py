"""Strategy search with the simulator, behind one interface.

:class:`SearchAlgorithm` (:mod:`search.algorithm`) searches a :class:`SearchProblem` within a
:class:`SearchBudget` and returns a :class:`SearchOutcome`; :func:`search_algorithm` gives one
by name (:data:`ALGORITHMS`): DisCo-style backtracking over fusion decisions and the whole space
(:mod:`search.backtrack`), Optuna's TPE, CMA-ES, NSGA-II and random samplers on a shareable
study (:mod:`search.optuna_search`), random partitions (:mod:`search.random_search`), and the
Horovod-style autotune baseline on live runs (:mod:`search.autotune`). What they search: the
parallel plans of a model (:mod:`search.plans`), the :class:`Space` of plans, fusion and compiled
blocks (:mod:`search.space`), priced by a :class:`StrategyEvaluator`
(:mod:`search.strategy_evaluator`) that batches data-parallel strategies through a
:class:`FusionEvaluator` (:mod:`search.fusion_evaluator`).
"""

from ddlsim.search.algorithm import (
    ParetoPoint,
    SearchAlgorithm,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
)
from ddlsim.search.registry import ALGORITHMS, STUDY_ALGORITHMS, search_algorithm
from ddlsim.search.space import Space

__all__ = [
    "ALGORITHMS",
    "STUDY_ALGORITHMS",
    "ParetoPoint",
    "SearchAlgorithm",
    "SearchBudget",
    "SearchOutcome",
    "SearchProblem",
    "Space",
    "search_algorithm",
]
