"""How far to trust a predicted speed-up, by kind of strategy, measured on held-out families.

A search takes the minimum over thousands of predictions, so it favours exactly the candidates
whose time the simulator underestimates most (the optimiser's curse), and some kinds of strategy
are underestimated on the whole: on the shipped CPU cluster, the executor's Python-side buckets
and DeAR's ring share the cores the ranks compute on, which the replay does not see. A pick
predicted a few per cent faster than DDP's defaults is then often measured slower.

:func:`calibrate` reads the rows of cross-validation (each run of a family the model was trained
without) and keeps, for each kind of strategy (:func:`risk_kind`), the errors of its predicted
speed-ups over DDP's defaults in the same group (model and cluster)::

    error = log(measured / measured_defaults) - log(predicted / predicted_defaults)

positive when the strategy ran slower, against DDP's defaults, than predicted; each error is
also kept under ``kind@N``, the world size of its group, since a kind's bias can turn over
between sizes (a search scores with the kind's errors at its own world size where there are
enough, :meth:`Calibration.quantile`). A search scores a
candidate at ``predicted_ms * exp(q-quantile of its kind's errors)`` (:meth:`Calibration.factor`):
with ``q = 0.8`` a pick that beats DDP's defaults on that score did so, against measurement, in
four of five held-out runs of its kind. DDP's defaults score at their prediction (their error
against themselves is zero by definition), so a search keeps them unless a candidate's margin
exceeds what its kind usually loses.
"""

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.evaluate import quantile

# Kinds of strategy by what the simulator gets wrong about them: the split of data-parallel
# buckets into DDP's own reducer and the executor's hooks matters (Python per bucket).
RISK_KINDS: tuple[str, ...] = (
    "default",
    "ddp",
    "hooks",
    "dear",
    "compiled",
    "fsdp",
    "tensor",
    "layers",
    "grid",
    "pipeline",
    "stages",
)
# Below this many held-out errors a kind borrows the errors of all kinds pooled.
MIN_ERRORS = 8
DEFAULT_CONFIDENCE = 0.8
_DEFAULTS = Strategy()


STRATEGY_KINDS: tuple[str, ...] = (
    "buckets",
    "dear",
    "compiled",
    "fsdp",
    "tensor",
    "layers",
    "grid",
    "pipeline",
    "stages",
)


def risk_kind(strategy: Strategy) -> str:
    """The kind a strategy's speed-up error is calibrated by: :attr:`Strategy.kind`, with DDP's
    defaults apart and buckets split into the executor's hooks and DDP's reducer (other caps,
    gradient accumulation)."""
    if strategy == _DEFAULTS:
        return "default"
    kind = strategy.kind
    if kind != "buckets":
        return kind
    return "ddp" if strategy.tensor_fusion.uses_ddp else "hooks"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Held-out errors of predicted speed-ups, sorted, by :func:`risk_kind`, for one predictor.

    ``errors["default"]`` holds DDP's defaults run again against their first run (the noise of
    a measured speed-up); it is reported, never applied.
    """

    predictor: str
    errors: Mapping[str, tuple[float, ...]]

    def pooled(self, world_size: int | None = None) -> tuple[float, ...]:
        """Every non-default kind's errors together (those measured on ``world_size`` ranks
        when given)."""
        suffix = f"@{world_size}" if world_size is not None else ""
        return tuple(
            sorted(
                e
                for key, es in self.errors.items()
                if _kind_of(key) != "default" and _world_of(key) == suffix
                for e in es
            )
        )

    def quantile(self, kind: str, confidence: float, world_size: int | None = None) -> float:
        """The ``confidence`` quantile of ``kind``'s errors (the pooled ones when it has fewer
        than :data:`MIN_ERRORS`); 0 for DDP's defaults, and 0 with no errors at all.

        With ``world_size``, and held-out errors kept by world size (checkpoints trained since
        2026-11-28): the kind's errors on that many ranks where it has :data:`MIN_ERRORS` of
        them; else the larger of the kind's quantile over every size and that of all kinds on
        that many ranks, since a kind's bias can turn over between sizes (grids: replayed
        pessimistic on 4 ranks, optimistic on 2) and a kind never measured at a size is an
        extrapolation."""
        if kind == "default":
            return 0.0
        overall = self._quantile(self.errors.get(kind, ()), confidence)
        if world_size is None or not any(_world_of(key) for key in self.errors):
            return overall
        here = self.errors.get(f"{kind}@{world_size}", ())
        if len(here) >= MIN_ERRORS:
            return quantile(here, confidence)
        pooled_here = self.pooled(world_size)
        if not pooled_here:
            return overall
        return max(overall, quantile(pooled_here, confidence))

    def _quantile(self, errors: Sequence[float], confidence: float) -> float:
        if len(errors) < MIN_ERRORS:
            errors = self.pooled()
        return quantile(errors, confidence) if errors else 0.0

    def factor(
        self, strategy: Strategy, confidence: float, world_size: int | None = None
    ) -> float:
        """What a predicted time of ``strategy`` is multiplied by to score it."""
        return self.kind_factor(risk_kind(strategy), confidence, world_size)

    def kind_factor(self, kind: str, confidence: float, world_size: int | None = None) -> float:
        """What a predicted time of a strategy of ``kind`` is multiplied by to score it: at
        least 1, so that a kind whose held-out speed-ups came out better than predicted (the
        grid kind's 15 runs of one launch, 2026-11-26) adds no margin rather than a discount
        a search would chase."""
        return math.exp(max(0.0, self.quantile(kind, confidence, world_size)))

    def summary(
        self, confidence: float, world_size: int | None = None
    ) -> dict[str, dict[str, float | int | None]]:
        """Per kind: the number of errors (on ``world_size`` ranks when given and kept by
        size), their median (the bias: positive when the kind's speed-ups are overestimated)
        and the applied factor at ``confidence``."""
        by_size = world_size is not None and any(_world_of(key) for key in self.errors)
        out: dict[str, dict[str, float | int | None]] = {}
        for kind in RISK_KINDS:
            errors = self.errors.get(f"{kind}@{world_size}" if by_size else kind, ())
            out[kind] = {
                "runs": len(errors),
                "median_error": statistics.median(errors) if errors else None,
                "factor": self.kind_factor(kind, confidence, world_size),
            }
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "predictor": self.predictor,
            "errors": {k: [round(e, 5) for e in es] for k, es in sorted(self.errors.items())},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "Calibration":
        """Raises:
        InvalidOptionError: not a calibration (a checkpoint's meta from another version)."""
        try:
            errors = {
                str(kind): tuple(sorted(float(e) for e in values))
                for kind, values in dict(raw["errors"]).items()
            }
            return cls(predictor=str(raw["predictor"]), errors=errors)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidOptionError(
                f"the checkpoint's calibration cannot be read: {exc}"
            ) from None


def calibrate(rows: Sequence[Mapping[str, Any]], predictor: str) -> Calibration:
    """The calibration of ``predictor`` from held-out rows (``group``, ``risk_kind``,
    ``measured_ms`` and ``<predictor>_ms`` each). A group's DDP's defaults are the median of
    their runs (the dataset runs them twice in half the groups); groups without a run of them
    give nothing.

    Raises:
        InvalidOptionError: rows without the predictor's times or the kind.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if "risk_kind" not in row or f"{predictor}_ms" not in row:
            raise InvalidOptionError(
                f"held-out rows need 'risk_kind' and '{predictor}_ms'; got {sorted(row)}"
            )
        groups.setdefault(str(row["group"]), []).append(row)
    errors: dict[str, list[float]] = {}
    for members in groups.values():
        defaults = [r for r in members if r["risk_kind"] == "default"]
        times = [float(r["measured_ms"]) for r in defaults if float(r["measured_ms"]) > 0]
        if not times or not float(defaults[0][f"{predictor}_ms"]) > 0:
            continue
        # DDP's defaults measured as the median of their runs (a repeat halves the noise)
        base_measured = statistics.median(times)
        base_predicted = float(defaults[0][f"{predictor}_ms"])
        if len(times) > 1:  # the repeat against the first run: the noise of a measurement
            errors.setdefault("default", []).append(math.log(times[1] / times[0]))
        ranks = _world_size_of(str(defaults[0]["group"]))
        for row in members:
            if row["risk_kind"] == "default":
                continue
            measured, predicted = float(row["measured_ms"]), float(row[f"{predictor}_ms"])
            if not (measured > 0 and predicted > 0):
                continue
            error = math.log(measured / base_measured) - math.log(predicted / base_predicted)
            errors.setdefault(str(row["risk_kind"]), []).append(error)
            if ranks is not None:  # and by world size: a kind's bias can turn over with it
                errors.setdefault(f"{row['risk_kind']}@{ranks}", []).append(error)
    return Calibration(
        predictor=predictor, errors={k: tuple(sorted(v)) for k, v in errors.items()}
    )


def _kind_of(key: str) -> str:
    return key.split("@", 1)[0]


def _world_of(key: str) -> str:
    """``@N`` of a key kept by world size, ``""`` for a kind's errors over every size."""
    return key[key.index("@") :] if "@" in key else ""


def _world_size_of(group: str) -> int | None:
    """The ranks of a held-out group (``[session/]model|ranks|link``), if it names them."""
    parts = group.split("|")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def check_confidence(confidence: float) -> float:
    """Raises:
    InvalidOptionError: a confidence outside [0.5, 0.99]."""
    if not 0.5 <= confidence <= 0.99:
        raise InvalidOptionError(
            f"confidence({confidence}) must be in [0.5, 0.99] (the quantile of held-out "
            "speed-up errors a pick is scored at), or 'off'"
        )
    return confidence
