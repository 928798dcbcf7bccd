"""Strategy search with the simulator: batched, memoised pricing of fusion strategies
(:mod:`search.evaluator`) and backtracking over bucket partitions and DeAR
(:mod:`search.backtrack`). Optuna searchers, parallel plans and ``ddlsim search`` follow."""
