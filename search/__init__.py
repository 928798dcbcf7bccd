"""Strategy search with the simulator: batched, memoised pricing of fusion strategies
(:mod:`search.evaluator`), backtracking over bucket partitions and DeAR (:mod:`search.backtrack`),
Optuna's TPE and CMA-ES over bucket caps (:mod:`search.optuna_search`) and random search
(:mod:`search.random_search`). Op fusion and parallel plans in the space follow."""
