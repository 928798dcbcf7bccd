"""The numbers of the GPU path fitted on published training runs.

Everything else the GPU path prices with comes from data sheets, NCCL's tuning model, per-op
times measured on one GPU and measurements papers publish. What no such source states is fitted
to published runs, and only these numbers are:

- ``clocks_mhz``: the SM clock a power-capped part sustains under a training load (torchtitan's
  H100s of 96 GB HBM2e held to 500 W). Its tensor-core peaks scale by the clock over the one
  they are stated at.

:data:`SHIPPED` is fitted on every shipped published file (``ddlsim.workflows.calibration``
refits it on any subset: ``benchmarks/published.py --hold-out-source`` predicts each file with
the numbers fitted on the others); :data:`PRIOR` is what a number is where no row constrains it,
stated from its physics rather than fitted.
"""

import dataclasses
from collections.abc import Mapping

from ddlsim.data.specs.gpu_cluster import (
    H100_HBM2E_500W,
    H100_PEAK_CLOCK_MHZ,
    HBM2E_500W_CLOCK_MHZ,
    GpuClusterSpec,
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """The fitted numbers: ``clocks_mhz`` maps a GPU's name to its sustained clock (MHz)."""

    clocks_mhz: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def apply(self, cluster: GpuClusterSpec) -> GpuClusterSpec:
        """``cluster`` with its GPU's fitted clock, where this calibration fits one for it and
        the GPU states the clock its peaks are given at."""
        gpu = cluster.gpu
        clock = self.clocks_mhz.get(gpu.name)
        if clock is None or gpu.peak_clock_mhz is None:
            return cluster
        return dataclasses.replace(cluster, gpu=dataclasses.replace(gpu, clock_mhz=clock))

    def to_json(self) -> dict[str, dict[str, float]]:
        return {"clocks_mhz": {name: round(mhz, 1) for name, mhz in self.clocks_mhz.items()}}


# The GPUs whose sustained clock is fitted: the power-capped parts of the presets.
CAPPED_GPUS: tuple[str, ...] = (H100_HBM2E_500W.name,)
SHIPPED = Calibration(clocks_mhz={H100_HBM2E_500W.name: HBM2E_500W_CLOCK_MHZ})
# Without a row on the part, its clock is in proportion to its power limit over the power its
# peaks are stated at (the SXM part's 700 W): a tensor-core-bound load holds the part at its
# limit, and where the voltage sits at its floor the dynamic power a clock cycle costs is the
# same at every clock, so power is linear in the clock. Stated, not fitted: nothing measured on
# a 500 W part outside training runs was found to fit it on (the fit on them is 2 % lower).
CAPPED_POWER_W = {H100_HBM2E_500W.name: (500.0, 700.0)}
PRIOR = Calibration(
    clocks_mhz={
        name: H100_PEAK_CLOCK_MHZ * limit / stated
        for name, (limit, stated) in CAPPED_POWER_W.items()
    }
)
