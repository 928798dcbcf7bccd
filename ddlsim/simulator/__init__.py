"""Iteration-time prediction: the replay over compute and communication streams (every plan
kind), the GNN cost model that corrects it and prices fused blocks, the datasets it learns
from, and held-out evaluation."""
