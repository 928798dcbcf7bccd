"""A synthetic GPU for the GPU path's learned cost: every family's iterations run half again
the roofline's time, and 40 us a parameter's optimizer launch more."""

import functools

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.gpu_cluster import H100_SXM
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.simulator.dataset import Dataset, KernelEntry
from ddlsim.simulator.gpu.cost import roofline_node_ms
from ddlsim.simulator.gpu.roofline import GpuOpCosts

FAMILIES = ("gpt2-tiny", "bert-tiny", "llama-tiny", "opt-tiny")


@functools.cache
def graph_of(name: str, precision: str = "fp32") -> IterationGraph:
    return capture_graph(ZOO[name], CaptureOptions(autocast=precision))


def truth_ms(graph: IterationGraph) -> float:
    """What the synthetic GPU measures of ``graph``'s iteration."""
    node_ms = roofline_node_ms(graph, GpuOpCosts(H100_SXM))
    optimizer_nodes = sum(1 for n in graph.nodes if n.kind == "optimizer")
    return 1.5 * sum(node_ms.values()) + 0.04 * optimizer_nodes


def kernel_entry(name: str, precision: str = "fp32") -> KernelEntry:
    graph = graph_of(name, precision)
    node_ms = roofline_node_ms(graph, GpuOpCosts(H100_SXM))
    return KernelEntry(graph=graph, node_ms=node_ms, iteration_time_ms=truth_ms(graph))


def synthetic_dataset() -> Dataset:
    """Kernel profiles of the four families, fp32 and bf16, as the synthetic GPU runs them."""
    kernels = {}
    for name in FAMILIES:
        for precision in ("fp32", "bf16"):
            entry = kernel_entry(name, precision)
            key = name if precision == "fp32" else f"{name}:{precision}"
            kernels[(key, entry.graph.model.inputs.batch_size)] = entry
    return Dataset(runs=(), kernels=kernels, links=(), meta={})
