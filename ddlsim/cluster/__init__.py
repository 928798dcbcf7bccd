"""An emulated cluster on one machine: one network namespace per rank, links shaped with ``tbf``.

``EmulatedCluster`` (:mod:`.launch`) is a context manager that makes the network
(:mod:`.namespaces`), starts one rank per host in it (:mod:`.host`) and waits for every rank; it
stops every process it started (:mod:`.processes`) on any exit, tells from the ranks' logs which
rank caused a failure (:mod:`.rank_logs`), and reports where each rank ran (:mod:`.placement`).

>>> with EmulatedCluster(2, "1gbit") as cluster:
...     result = cluster.launch("ddlsim.profiler.collective_rank", args, timeout_s=120)
"""

from ddlsim.cluster.emulated import (
    FORCE_LOOPBACK_ENV,
    MAX_WORLD_SIZE,
    ClusterRunError,
    EmulatedCluster,
    LaunchResult,
    LoopbackFallbackWarning,
    Network,
)
from ddlsim.cluster.namespaces import (
    NAMESPACE_PREFIX,
    ClusterSetupError,
    netns_unavailable_reason,
    remove_stale_namespaces,
    stale_namespaces,
)
from ddlsim.cluster.placement import PLACEMENT_ENV, RankPlacement, report_placement
from ddlsim.cluster.processes import die_with_parent, stop_processes

__all__ = [
    "FORCE_LOOPBACK_ENV",
    "MAX_WORLD_SIZE",
    "NAMESPACE_PREFIX",
    "PLACEMENT_ENV",
    "ClusterRunError",
    "ClusterSetupError",
    "EmulatedCluster",
    "LaunchResult",
    "LoopbackFallbackWarning",
    "Network",
    "RankPlacement",
    "die_with_parent",
    "netns_unavailable_reason",
    "remove_stale_namespaces",
    "report_placement",
    "stale_namespaces",
    "stop_processes",
]
