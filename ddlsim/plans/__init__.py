"""What a strategy means and whether it can run: the plan rules and one feasibility check."""
