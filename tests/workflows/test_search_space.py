"""The search's space holds only what the model can take: per-layer placements of a model
whose heads tp does not divide are not offered (its grids still are), and T5's stacks, whose
blocks share a position bias, are marked to move as one."""

from types import SimpleNamespace
from typing import Any

from ddlsim.data.zoo import ZOO
from ddlsim.workflows import search
from ddlsim.workflows.requests import SearchRequest


def _space(model: str) -> Any:
    request = SearchRequest(model=ZOO[model], world_size=2, bandwidth="1gbit", prior="none")
    evaluator: Any = SimpleNamespace(blocks=())
    return search._space(request, request.model, evaluator, grad_mb=1.0)


def test_a_model_whose_heads_tp_does_not_divide_keeps_its_grids_without_placements() -> None:
    space = _space("vit-tiny")  # 3 heads
    assert any(plan.grid for plan in space.plans)
    assert not any(plan.tp > 1 and not plan.grid for plan in space.plans)
    assert space.layer_blocks == 0


def test_t5s_stacks_move_as_one() -> None:
    space = _space("t5-tiny")
    assert space.layer_blocks == len(space.layer_stacks) > 0
    # the encoder's blocks first, then the decoder's: two stacks
    assert sorted(set(space.layer_stacks)) == [0, 1]
    assert list(space.layer_stacks) == sorted(space.layer_stacks)
    assert _space("gpt2-tiny").layer_stacks == ()
