from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.search.scale_plans import ScaleSpace, layouts, search_layouts

SPACE = ScaleSpace(gpus=32, gpus_per_node=8, layers=8, tp_options=(1, 2, 4, 8), global_batch=64)


def test_layouts_fill_the_cluster_and_divide_the_batch() -> None:
    plans = list(layouts(SPACE))
    assert plans
    for plan in plans:
        assert plan.dp * plan.tp * plan.pp == 32
        assert plan.tp <= 8 and plan.pp <= 8
        assert 64 % (plan.dp * plan.micro_batches) == 0
        assert plan.sequence_parallel == (plan.tp > 1)
        if plan.pp_schedule == "interleaved":
            assert plan.pp * plan.virtual_stages <= 8
            assert plan.micro_batches % plan.pp == 0
    assert {p.recompute for p in plans} == {"none", "selective", "selective_op", "full"}
    assert any(p.fsdp for p in plans) and not any(p.fsdp and p.dp == 1 for p in plans)


def test_search_keeps_what_fits_and_replays_the_best() -> None:
    calls: list[tuple[ScalePlan, bool]] = []

    def evaluate(plan: ScalePlan, replay: bool) -> tuple[float, float, bool]:
        calls.append((plan, replay))
        if plan.tp == 8:
            raise InvalidStrategyError("tp 8 does not divide the heads")
        seconds = 1.0 + plan.pp * 0.1 + (0.05 if replay else 0.0) + plan.tp * 0.01
        return seconds, 10.0 * plan.tp, plan.recompute != "none"

    result = search_layouts(SPACE, evaluate)
    assert result.best is not None and result.best.replayed
    assert result.failed > 0 and result.refused_memory > 0
    assert all(r.plan.recompute != "none" for r in result.ranked)
    replayed = [r for r in result.ranked if r.replayed]
    assert result.best.iteration_s == min(r.iteration_s for r in replayed)
    assert (result.best.plan.pp, result.best.plan.tp) == (1, 1)
    assert sum(1 for _, replay in calls if replay) == len(replayed)
