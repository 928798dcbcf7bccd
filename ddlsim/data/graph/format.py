"""``IterationGraph``: one training iteration as a DAG, and its JSON form.

Node ids are positions in a topological order (the order the ops ran), so every edge goes from
a lower id to a higher one. JSON carries ``schema_version``; :meth:`IterationGraph.from_json`
refuses any other version and any malformed node or edge. The content hash covers everything
that describes the iteration (spec, strategy, optimizer, parameters, nodes, edges) and nothing
about where it was captured, so the same spec gives the same hash.
"""

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any, Literal, get_args

from ddlsim.data.errors import InvalidGraphError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy

SCHEMA_VERSION = 1
NodeKind = Literal["compute", "grad_ready", "comm", "optimizer"]
Phase = Literal["forward", "backward", "comm", "optimizer"]
NODE_KINDS: tuple[str, ...] = get_args(NodeKind)
PHASES: tuple[str, ...] = get_args(Phase)
_DTYPE_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TensorMeta:
    """Shape and dtype of one tensor (``dtype`` as torch names it, without ``torch.``)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes of a dense tensor of this shape and dtype (4 per element for unknown dtypes)."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * _DTYPE_BYTES.get(self.dtype, 4)

    def to_json(self) -> list[Any]:
        return [list(self.shape), self.dtype]

    @classmethod
    def from_json(cls, raw: Any) -> "TensorMeta":
        if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[1], str)):
            raise InvalidGraphError(f"tensor meta must be [shape, dtype], got {raw!r}")
        return cls(shape=tuple(int(d) for d in raw[0]), dtype=raw[1])


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ParamInfo:
    """One trainable parameter (tied weights appear once, under their first name)."""

    name: str
    module: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    nbytes: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GraphNode:
    """One node: an ATen op, a gradient becoming ready, a collective or an optimizer step.

    ``flops`` follow ``torch.utils.flop_counter`` (a multiply-add is 2 FLOPs; only ops it has a
    formula for count) for compute nodes; optimizer nodes carry an elementwise estimate.
    ``bytes_read``/``bytes_written`` are the tensors an op touches (0 for views, which move no
    data). ``forward_id`` links a backward op to the forward op whose autograd node ran it.
    """

    id: int
    kind: NodeKind
    phase: Phase
    op: str
    module: str
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    is_view: bool = False
    param: str | None = None
    params: tuple[str, ...] = ()
    param_bytes: int = 0
    grad_bytes: int = 0
    bucket: int | None = None
    forward_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "phase": self.phase,
            "op": self.op,
            "module": self.module,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "is_view": self.is_view,
            "param": self.param,
            "params": list(self.params),
            "param_bytes": self.param_bytes,
            "grad_bytes": self.grad_bytes,
            "bucket": self.bucket,
            "forward_id": self.forward_id,
        }
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "GraphNode":
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(raw, Mapping) or set(raw) != fields:
            keys = sorted(raw) if isinstance(raw, Mapping) else raw
            raise InvalidGraphError(f"graph node must have keys {sorted(fields)}, got {keys}")
        if raw["kind"] not in NODE_KINDS or raw["phase"] not in PHASES:
            raise InvalidGraphError(
                f"node {raw['id']}: kind {raw['kind']!r} / phase {raw['phase']!r}; allowed kinds "
                f"{', '.join(NODE_KINDS)}, phases {', '.join(PHASES)}"
            )
        values = dict(raw)
        values["inputs"] = tuple(TensorMeta.from_json(t) for t in raw["inputs"])
        values["outputs"] = tuple(TensorMeta.from_json(t) for t in raw["outputs"])
        values["params"] = tuple(raw["params"])
        return cls(**values)


@dataclasses.dataclass(frozen=True, kw_only=True)
class IterationGraph:
    """A captured training iteration.

    ``env`` records where it was captured (library versions); it is kept in JSON but left out
    of :attr:`graph_hash`.
    """

    model: ModelSpec
    strategy: Strategy
    optimizer: str
    params: tuple[ParamInfo, ...]
    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[int, int], ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for position, node in enumerate(self.nodes):
            if node.id != position:
                raise InvalidGraphError(
                    f"node ids must be 0..n-1 in order; node {position} has id {node.id}"
                )
        count = len(self.nodes)
        for src, dst in self.edges:
            if not (0 <= src < dst < count):
                raise InvalidGraphError(
                    f"edge ({src}, {dst}) must go forward between existing nodes (0..{count - 1})"
                )

    # ----- views -----------------------------------------------------------------------------

    def nodes_of(self, kind: NodeKind) -> list[GraphNode]:
        return [n for n in self.nodes if n.kind == kind]

    @property
    def grad_ready_order(self) -> list[str]:
        """Parameter names in the order their gradients became ready during backward."""
        return [n.param for n in self.nodes if n.kind == "grad_ready" and n.param is not None]

    @property
    def gradient_sizes(self) -> list[tuple[str, int]]:
        """``(parameter name, gradient bytes)`` in gradient-ready order."""
        nbytes = {p.name: p.nbytes for p in self.params}
        return [(name, nbytes[name]) for name in self.grad_ready_order]

    @property
    def params_without_grad(self) -> list[str]:
        """Parameters no gradient reached in the captured iteration (the loss does not depend
        on them: DINOv2's ``mask_token`` without a mask), sorted by name."""
        return sorted({p.name for p in self.params} - set(self.grad_ready_order))

    @property
    def num_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def grad_bytes(self) -> int:
        return sum(n.grad_bytes for n in self.nodes if n.kind == "grad_ready")

    def flops_of(self, phase: Phase) -> int:
        return sum(n.flops for n in self.nodes if n.phase == phase)

    def predecessors(self) -> list[list[int]]:
        preds: list[list[int]] = [[] for _ in self.nodes]
        for src, dst in self.edges:
            preds[dst].append(src)
        return preds

    def summary(self) -> dict[str, Any]:
        """The headline numbers (what ``ddlsim graph --json`` prints)."""
        by_kind = {kind: 0 for kind in NODE_KINDS}
        for node in self.nodes:
            by_kind[node.kind] += 1
        return {
            "model": self.model.label,
            "schema_version": self.schema_version,
            "num_nodes": len(self.nodes),
            "num_edges": len(self.edges),
            "nodes_by_kind": by_kind,
            "num_params": self.num_params,
            "num_param_tensors": len(self.params),
            "forward_flops": self.flops_of("forward"),
            "backward_flops": self.flops_of("backward"),
            "optimizer_flops": self.flops_of("optimizer"),
            "grad_bytes": self.grad_bytes,
            "num_buckets": len({n.bucket for n in self.nodes if n.kind == "comm"}),
            "params_without_grad": self.params_without_grad,
            "optimizer": self.optimizer,
            "inputs": self.model.inputs.to_dict(),
            "graph_hash": self.graph_hash,
        }

    # ----- serialization ---------------------------------------------------------------------

    def _content(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "model": self.model.to_dict(),
            "strategy": self.strategy.to_dict(),
            "optimizer": self.optimizer,
            "params": [
                {
                    "name": p.name,
                    "module": p.module,
                    "shape": list(p.shape),
                    "dtype": p.dtype,
                    "numel": p.numel,
                    "nbytes": p.nbytes,
                }
                for p in self.params
            ],
            "nodes": [n.to_json() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
        }

    @cached_property
    def graph_hash(self) -> str:
        """SHA-256 of the canonical JSON of the graph's content."""
        canonical = json.dumps(self._content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        out = self._content()
        out["env"] = dict(self.env)
        out["graph_hash"] = self.graph_hash
        return out

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "IterationGraph":
        if not isinstance(raw, Mapping):
            raise InvalidGraphError(f"graph must be a JSON object, got {type(raw).__name__}")
        version = raw.get("schema_version")
        if version != SCHEMA_VERSION:
            raise InvalidGraphError(
                f"graph schema_version {version!r} is not supported; allowed: {SCHEMA_VERSION}"
            )
        required = {"model", "strategy", "optimizer", "params", "nodes", "edges"}
        missing = sorted(required - set(raw))
        if missing:
            raise InvalidGraphError(f"graph is missing {', '.join(missing)}")
        try:
            graph = cls(
                model=ModelSpec.from_dict(raw["model"]),
                strategy=Strategy.from_dict(raw["strategy"]),
                optimizer=raw["optimizer"],
                params=tuple(
                    ParamInfo(**{**p, "shape": tuple(p["shape"])}) for p in raw["params"]
                ),
                nodes=tuple(GraphNode.from_json(n) for n in raw["nodes"]),
                edges=_edges(raw["edges"]),
                env=dict(raw.get("env", {})),
                schema_version=version,
            )
        except (TypeError, KeyError, ValueError) as exc:
            if isinstance(exc, InvalidGraphError):
                raise
            raise InvalidGraphError(f"malformed graph: {exc}") from None
        stored = raw.get("graph_hash")
        if stored is not None and stored != graph.graph_hash:
            raise InvalidGraphError(
                f"graph_hash {stored} does not match the content ({graph.graph_hash})"
            )
        return graph

    @classmethod
    def from_json(cls, text: str) -> "IterationGraph":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidGraphError(f"graph is not valid JSON: {exc.msg}") from None
        return cls.from_dict(raw)


def _edges(raw: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    out = []
    for edge in raw:
        if len(edge) != 2:
            raise InvalidGraphError(f"edge must be [src, dst], got {edge!r}")
        out.append((int(edge[0]), int(edge[1])))
    return tuple(out)
