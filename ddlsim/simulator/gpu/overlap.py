"""Communication overlapped with compute on a GPU, and what the overlap costs.

An NCCL kernel that runs beside a compute kernel is not free: it occupies SMs (one per channel)
and HBM bandwidth the compute kernel would have used, so the compute slows while both run, and
the collective slows too. ddlsim prices a stretch of ``compute_ms`` of compute with
``comm_ms`` of communication issued beside it as

    max(compute_ms + CONTENTION * min(comm_ms, compute_ms), comm_ms)

the compute slowed by ``CONTENTION`` for as long as the two overlap, or the communication
where it is the longer. What is exposed (the time beyond the compute alone) is the
communication's cost to the iteration, split from the compute in the breakdowns.

``CONTENTION`` is the published average: compute kernels overlapped with collectives ran
18.9 % slower than alone (worst 40 %) in GPT and LLaMA training on A100s, H100s and MI250s
(Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning,
arXiv 2507.03114). Single cases agree in direction and size: NVIDIA/nccl issue 1428 measured an
A100 GEMM 1.76x slower beside an all-gather (HBM traffic, NCCL's copies costing 2-3x their wire
bytes), pytorch/pytorch PR 179937 matmuls 30-40 % slower beside NCCL on H100s.
"""

import dataclasses

# Compute slows by this fraction of the overlapped time while an NCCL collective runs beside it.
CONTENTION = 0.189
# Decomposed (asynchronous) tensor parallelism: each of the ``tp`` GEMM chunks it splits a
# projection into runs at a lower efficiency than the whole GEMM; this fraction of the matmuls'
# time is lost to it.
DECOMPOSITION_LOSS = 0.05


def overlapped_ms(compute_ms: float, comm_ms: float) -> float:
    """The time ``compute_ms`` of compute takes with ``comm_ms`` of communication beside it."""
    if comm_ms <= 0:
        return compute_ms
    return max(compute_ms + CONTENTION * min(comm_ms, compute_ms), comm_ms)


def exposed_ms(compute_ms: float, comm_ms: float) -> float:
    """What overlapping ``comm_ms`` with ``compute_ms`` adds to the compute alone."""
    return overlapped_ms(compute_ms, comm_ms) - compute_ms


@dataclasses.dataclass(frozen=True, slots=True)
class Exposed:
    """Communication time a pass adds beyond its compute, by fabric level (ms)."""

    node: float = 0.0
    network: float = 0.0

    @property
    def total(self) -> float:
        return self.node + self.network

    def __add__(self, other: "Exposed") -> "Exposed":
        return Exposed(self.node + other.node, self.network + other.network)

    def scaled(self, factor: float) -> "Exposed":
        return Exposed(self.node * factor, self.network * factor)

    @classmethod
    def at(cls, level_is_network: bool, ms: float) -> "Exposed":
        return cls(network=ms) if level_is_network else cls(node=ms)


def decomposed_tp_ms(comm_ms: float, matmul_ms: float, tp: int) -> float:
    """Exposed time of a pass's tensor-parallel collectives under asynchronous (decomposed)
    tensor parallelism: each projection's all-gather (or reduce-scatter) is split into ``tp``
    steps, each overlapped with the GEMM of the chunk that arrived before it, so one step in
    ``tp`` stays exposed, the rest hides behind the matmuls (slowed by the contention), and the
    chunked GEMMs lose :data:`DECOMPOSITION_LOSS` of their efficiency."""
    if comm_ms <= 0 or tp <= 1:
        return 0.0
    first = comm_ms / tp
    return first + exposed_ms(matmul_ms, comm_ms - first) + DECOMPOSITION_LOSS * matmul_ms
