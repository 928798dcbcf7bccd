"""Strategy search with the simulator: the space of parallel plans, tensor and op fusion and
their pricing and memory (:mod:`search.space`), DisCo-style backtracking over fusion decisions
(:mod:`search.backtrack`) and over the whole space (:mod:`search.joint`), Optuna's TPE, CMA-ES,
NSGA-II and random samplers on a shareable study (:mod:`search.optuna_search`), random
partitions (:mod:`search.random_search`), and the Horovod-style autotune baseline on live runs
(:mod:`search.autotune`)."""
