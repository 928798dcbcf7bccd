"""Strategy search over fusion and parallel plans with the simulator (not yet built)."""
