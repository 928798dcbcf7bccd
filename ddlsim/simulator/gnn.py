"""The learned cost model: a message-passing encoder over the rank's graph and a strategy head.

The encoder (GINE layers over data-dependency and program-order edges, as DisCo's GNN reads
HLO) gives every node an embedding. Three heads read them:

- the duration head predicts each op's time (log1p µs) from its embedding, trained on the
  kernel profiles with some durations hidden from the input: it prices ops never profiled;
- the fused-block head predicts how much faster (or slower) a block runs compiled than its
  ops eager, from its nodes' embeddings, trained on fusion profiles: it prices op fusion
  candidates that were never compiled (DisCo's fused-kernel model, at block granularity);
- the strategy head reads one strategy as a set of bucket tokens (each with the mean
  embedding of its gradients' nodes), the mean embedding of the compiled blocks' nodes and of
  the whole graph, and global features (the replay's time and breakdown, the link, the plan),
  and predicts ``log(measured / replayed)``: the correction of the replay.

A model's graph is encoded once; any number of strategies are then priced by the head alone,
which is what makes batched evaluation fast.
"""

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import GINEConv
from torch_geometric.utils import scatter

from ddlsim.data.errors import InvalidOptionError
from ddlsim.simulator.features import (
    BLOCK_FEATURES,
    BUCKET_FEATURES,
    EDGE_TYPES,
    GLOBAL_FEATURES,
    NODE_FEATURES,
    BlockSample,
    StrategySample,
)

# 2: plan features (tensor and pipeline degrees, FSDP, schedule, bubble) among the globals, and
# the fused-block head. 3: grid plans' features.
CHECKPOINT_FORMAT = 3
DURATION_COLUMN = NODE_FEATURES.index("log1p_duration_us")
KNOWN_COLUMN = NODE_FEATURES.index("duration_known")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CostModelConfig:
    """Sizes of the cost model. The defaults keep an epoch over the shipped dataset (45 graphs,
    40k nodes) near 0.2 s on one core: held-out cross-validation, eight trainings, fits in the
    ten minutes ``ddlsim simulator train`` may take."""

    hidden: int = 32
    layers: int = 3

    def __post_init__(self) -> None:
        if self.hidden < 4 or self.layers < 1:
            raise InvalidOptionError(
                f"hidden({self.hidden}) must be >= 4 and layers({self.layers}) >= 1"
            )


def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


class IterationCostModel(nn.Module):
    """Encoder, duration head and strategy head (see the module docstring)."""

    def __init__(self, config: CostModelConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden
        self.node_in = nn.Sequential(
            nn.LayerNorm(len(NODE_FEATURES)), _mlp(len(NODE_FEATURES), h, h)
        )
        self.convs = nn.ModuleList(
            GINEConv(_mlp(h, h, h), edge_dim=len(EDGE_TYPES)) for _ in range(config.layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(config.layers))
        self.duration_head = _mlp(h, h, 1)
        self.fused_head = _mlp(2 * h + len(BLOCK_FEATURES), h, 1)
        self.bucket_in = _mlp(len(BUCKET_FEATURES) + h, h, h)
        self.global_norm = nn.LayerNorm(len(GLOBAL_FEATURES))
        self.head = nn.Sequential(
            nn.Linear(4 * h + 2 * len(GLOBAL_FEATURES), h),
            nn.ReLU(),
            nn.Linear(h, h),
            nn.ReLU(),
            nn.Linear(h, 1),
        )

    def encode(
        self, graphs: Batch, hide: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Node embeddings and predicted durations; ``hide`` masks rows' profiled durations.

        Shapes:
            graphs.x: ``[num_nodes, len(NODE_FEATURES)]``; hide: ``[num_nodes]`` bool;
            returns ``[num_nodes, hidden]`` and ``[num_nodes]`` (log1p µs).
        """
        x = graphs.x
        if hide is not None:
            x = x.clone()
            x[hide, DURATION_COLUMN] = 0.0
            x[hide, KNOWN_COLUMN] = 0.0
        h = self.node_in(x)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = norm(h + torch.relu(conv(h, graphs.edge_index, graphs.edge_attr)))
        return h, self.duration_head(h).squeeze(-1)

    def corrections(
        self,
        h: torch.Tensor,
        graphs: Batch,
        model_index: dict[str, int],
        samples: Sequence[StrategySample],
    ) -> torch.Tensor:
        """``log(measured / replayed)`` predicted for each sample (its model among ``graphs``).

        Shapes:
            h: ``[num_nodes, hidden]``; returns ``[num_samples]``.

        Long: the batch's token, row and sample indices are gathered in one pass so that each
        head runs once over one tensor.
        """
        offsets = graphs.ptr.tolist()
        pooled_graph = scatter(h, graphs.batch, dim=0, dim_size=graphs.num_graphs, reduce="mean")
        token_rows: list[int] = []
        token_of_row: list[int] = []
        bucket_of_sample: list[int] = []
        compiled_rows: list[int] = []
        compiled_of: list[int] = []
        which = []
        tokens: list[tuple[float, ...]] = []
        for s, sample in enumerate(samples):
            m = model_index[sample.model_key]
            which.append(m)
            offset = offsets[m]
            base = len(bucket_of_sample)
            for b, rows in enumerate(sample.bucket_rows):
                token_rows += [offset + r for r in rows] if offset else rows
                token_of_row += [base + b] * len(rows)
            bucket_of_sample += [s] * len(sample.buckets)
            tokens += sample.buckets
            compiled_rows += [offset + r for r in sample.compiled_rows]
            compiled_of += [s] * len(sample.compiled_rows)
        n = len(samples)
        hidden = h.shape[1]
        num_tokens = len(bucket_of_sample)
        token_h = (
            scatter(
                h[_indices(token_rows)],
                _indices(token_of_row),
                dim=0,
                dim_size=num_tokens,
                reduce="mean",
            )
            if token_rows
            else h.new_zeros(num_tokens, hidden)
        )
        width = len(BUCKET_FEATURES)
        token_features = torch.from_numpy(
            np.fromiter(
                itertools.chain.from_iterable(tokens), dtype=np.float32, count=num_tokens * width
            ).reshape(num_tokens, width)
        )
        token_in = torch.cat([token_features, token_h], dim=1)
        token_out = self.bucket_in(token_in)
        owner = _indices(bucket_of_sample)
        bucket_sum = scatter(token_out, owner, dim=0, dim_size=n, reduce="sum") / 16.0
        bucket_mean = scatter(token_out, owner, dim=0, dim_size=n, reduce="mean")
        if compiled_rows:
            compiled = scatter(
                h[_indices(compiled_rows)],
                _indices(compiled_of),
                dim=0,
                dim_size=n,
                reduce="mean",
            )
        else:
            compiled = h.new_zeros(n, hidden)
        raw_globals = torch.from_numpy(
            np.array([s.globals for s in samples], dtype=np.float32).reshape(
                n, len(GLOBAL_FEATURES)
            )
        )
        features = torch.cat(
            [
                bucket_sum,
                bucket_mean,
                compiled,
                pooled_graph[torch.tensor(which, dtype=torch.long)],
                self.global_norm(raw_globals),
                raw_globals,
            ],
            dim=1,
        )
        return self.head(features).squeeze(-1)

    def fused_ratios(
        self,
        h: torch.Tensor,
        graphs: Batch,
        model_index: dict[str, int],
        blocks: Sequence[BlockSample],
    ) -> torch.Tensor:
        """``log(compiled / eager)`` time predicted for each block (its model among ``graphs``),
        from the mean and the scaled sum of its nodes' embeddings and its eager time.

        Shapes:
            h: ``[num_nodes, hidden]``; returns ``[num_blocks]``.
        """
        if not blocks:
            return h.new_zeros(0)
        rows: list[int] = []
        owner: list[int] = []
        for b, block in enumerate(blocks):
            offset = int(graphs.ptr[model_index[block.model_key]])
            rows += [offset + r for r in block.rows]
            owner += [b] * len(block.rows)
        index = torch.tensor(owner, dtype=torch.long)
        selected = h[torch.tensor(rows, dtype=torch.long)]
        mean = scatter(selected, index, dim=0, dim_size=len(blocks), reduce="mean")
        total = scatter(selected, index, dim=0, dim_size=len(blocks), reduce="sum") / 64.0
        features = torch.stack([b.features for b in blocks])
        return self.fused_head(torch.cat([mean, total, features], dim=1)).squeeze(-1)

    def checkpoint(self, meta: dict[str, Any]) -> dict[str, Any]:
        """What :func:`network_from_checkpoint` reads back: tensors and plain data only."""
        return {
            "format": CHECKPOINT_FORMAT,
            "config": dataclasses.asdict(self.config),
            "state": self.state_dict(),
            "meta": meta,
        }


def network_from_checkpoint(raw: dict[str, Any]) -> tuple[IterationCostModel, dict[str, Any]]:
    """A model from :meth:`IterationCostModel.checkpoint` (as ``torch.load`` with
    ``weights_only=True`` returns it).

    Raises:
        InvalidOptionError: another format, or weights that do not fit the model.
    """
    if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise InvalidOptionError(
            f"cost model checkpoint has format {found!r}; allowed: {CHECKPOINT_FORMAT} "
            "(retrain it with `ddlsim simulator train`)"
        )
    model = IterationCostModel(CostModelConfig(**raw["config"]))
    try:
        model.load_state_dict(raw["state"])
    except RuntimeError as exc:
        raise InvalidOptionError(f"cost model checkpoint does not fit the model: {exc}") from None
    model.eval()
    return model, dict(raw.get("meta", {}))


def _indices(values: list[int]) -> torch.Tensor:
    """``values`` as a long tensor (through numpy: a few times faster than ``torch.tensor``
    on the long index lists a batch of strategies makes)."""
    return torch.from_numpy(np.fromiter(values, dtype=np.int64, count=len(values)))
