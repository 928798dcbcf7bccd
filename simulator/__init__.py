"""Iteration-time prediction: stream replay and the GNN cost model (not yet built)."""
