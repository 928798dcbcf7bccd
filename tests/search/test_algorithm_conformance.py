"""Every registered search algorithm keeps the :class:`SearchAlgorithm` contract: on a small
space whose optimum is known it finds it, it keeps to its budget and its time limit, it is
deterministic under a seed, and it reports its progress.

The evaluator is a fake whose prices are defined here, so that the answer is known and the
tests take seconds: a strategy costs 100 ms with every one of the four 1 MB gradients in its own
bucket, 10 ms more for each bucket fewer, 50 ms more off DDP's plan, 1 ms less for each compiled
block; FSDP's plan does not fit the device. A live run (autotune's) measures the same price.
"""

import contextlib
import time
from collections.abc import Iterator, Sequence

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.search import (
    ALGORITHMS,
    STUDY_ALGORITHMS,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
    Space,
    search_algorithm,
)
from ddlsim.search.algorithm import Progress
from ddlsim.search.optuna_search import OptunaSearch, SharedStudy
from ddlsim.simulator.memory import GIB, MemoryEstimate

MB = 2**20
BLOCKS = ("b0", "b1")
FUSION_OPTIMUM_MS = 100.0  # every gradient alone
JOINT_OPTIMUM_MS = FUSION_OPTIMUM_MS - len(BLOCKS)  # and every block compiled, on DDP's plan
# Autotune tunes DDP's bucket cap only: it searches the fusion space whatever the problem.
SIMULATOR_ALGORITHMS = [name for name in ALGORITHMS if name != "autotune"]


class FakeEvaluator:
    """Prices strategies as the module docstring says, memoised; ``delay_s`` a call."""

    def __init__(self, order: Sequence[str], *, delay_s: float = 0.0) -> None:
        self.order = tuple(order)
        self.delay_s = delay_s
        self.memo: dict[str, float] = {}
        self.on_priced: Progress | None = None
        self.runs = 0

    @property
    def evaluations(self) -> int:
        return len(self.memo)

    def price(self, strategies: Sequence[Strategy]) -> list[float]:
        todo = {s.to_json(): s for s in strategies if s.to_json() not in self.memo}
        if todo:
            time.sleep(self.delay_s)
            self.memo.update({key: self.cost_ms(s) for key, s in todo.items()})
            if self.on_priced is not None:
                self.on_priced(len(todo))
        return [self.memo[s.to_json()] for s in strategies]

    def measure(self, strategy: Strategy) -> float:
        """A live run: slower than pricing, the same time."""
        time.sleep(4 * self.delay_s)
        self.runs += 1
        return self.cost_ms(strategy)

    def cost_ms(self, strategy: Strategy) -> float:
        buckets = strategy.tensor_fusion.assign([(name, MB) for name in self.order])
        plan = 0.0 if strategy.parallel == ParallelPlan() else 50.0
        ms = 100.0 + 10.0 * (len(self.order) - len(buckets)) + plan
        return ms - len(strategy.op_fusion.compiled)

    def feasible(self, strategy: Strategy) -> bool:
        return not strategy.parallel.fsdp

    def memory(self, strategy: Strategy) -> MemoryEstimate:
        weights = (3 if strategy.parallel.fsdp else 1) * GIB
        return MemoryEstimate(
            weights_bytes=weights,
            grads_bytes=0,
            optimizer_bytes=0,
            buffers_bytes=0,
            activations_bytes=len(strategy.op_fusion.compiled),
        )


def _problem(
    *, gradients: int = 4, fusion_only: bool = True, delay_s: float = 0.0
) -> tuple[SearchProblem, FakeEvaluator]:
    order = [f"g{i}" for i in range(gradients)]
    fake = FakeEvaluator(order, delay_s=delay_s)
    plans: tuple[ParallelPlan, ...] = (ParallelPlan(),)
    if not fusion_only:
        plans += (ParallelPlan(micro_batches=2), ParallelPlan(fsdp=True))
    space = Space(
        plans=plans, total_grad_mb=float(gradients), blocks=() if fusion_only else BLOCKS
    )
    problem = SearchProblem(
        evaluator=fake,
        space=space,
        order=order,
        sizes=[MB] * gradients,
        fusion_only=fusion_only,
        measure=fake.measure,
    )
    return problem, fake


def _search(
    name: str, problem: SearchProblem, budget: SearchBudget
) -> tuple[SearchOutcome, list[int]]:
    calls: list[int] = []
    outcome = search_algorithm(name).search(problem, budget, calls.append)
    return outcome, calls


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_finds_the_known_optimum_of_the_fusion_space(name: str) -> None:
    problem, fake = _problem()
    outcome, calls = _search(name, problem, SearchBudget(evaluations=60, time_limit_s=60))
    assert outcome.best_ms == FUSION_OPTIMUM_MS
    # DDP's defaults (autotune caps DDP's bucket at the gradients' total: the same buckets)
    grads = [(g, MB) for g in problem.order]
    assert outcome.baseline.tensor_fusion.assign(grads) == Strategy().tensor_fusion.assign(grads)
    assert outcome.baseline_ms == fake.cost_ms(Strategy())
    assert len(outcome.best.tensor_fusion.assign(grads)) == 4
    assert outcome.top[0][1] == outcome.best_ms and len(outcome.top) <= 5
    assert list(outcome.curve) == sorted(outcome.curve, reverse=True)  # best so far only falls
    assert outcome.curve[-1] == outcome.best_ms
    # progress heard of every strategy priced (or run measured), and the hook is restored
    assert sum(calls) == fake.evaluations + fake.runs and all(n > 0 for n in calls)
    assert fake.on_priced is None


@pytest.mark.parametrize("name", SIMULATOR_ALGORITHMS)
def test_finds_the_known_optimum_of_the_whole_space_and_prunes(name: str) -> None:
    problem, fake = _problem(fusion_only=False)
    outcome, _ = _search(name, problem, SearchBudget(evaluations=80, time_limit_s=60, seed=1))
    assert outcome.best_ms == JOINT_OPTIMUM_MS
    assert outcome.best.parallel == ParallelPlan()
    assert outcome.best.op_fusion.compiled == BLOCKS
    assert all(fake.feasible(strategy) for strategy, _ in outcome.top)
    assert '"fsdp": true' not in "".join(fake.memo)  # never priced
    assert sum(outcome.pruned.values()) >= 1  # FSDP's plan: never priced, counted


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_keeps_to_its_evaluation_budget(name: str) -> None:
    problem, fake = _problem(gradients=12)
    outcome, calls = _search(name, problem, SearchBudget(evaluations=7, time_limit_s=60))
    assert outcome.evaluations <= 7
    # a shared study's budget counts trials: the baseline is priced besides them
    assert fake.evaluations <= 7 + 1 and fake.runs <= 7
    assert sum(calls) == fake.evaluations + fake.runs


@pytest.mark.timing
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_keeps_to_its_time_limit(name: str) -> None:
    problem, fake = _problem(gradients=40, delay_s=0.05)
    limit_s = 0.5
    start = time.perf_counter()
    outcome, _ = _search(name, problem, SearchBudget(evaluations=100_000, time_limit_s=limit_s))
    wall_s = time.perf_counter() - start
    # stopped by the clock, not the budget; the work in flight (a batch, a trial, a run) ends
    assert outcome.evaluations < 100_000 and fake.evaluations + fake.runs < 100_000
    assert outcome.elapsed_s < limit_s + 1.5 and wall_s < limit_s + 2.0


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_is_deterministic_under_a_seed(name: str) -> None:
    budget = SearchBudget(evaluations=25, time_limit_s=60, seed=3)
    first, _ = _search(name, _problem(gradients=8)[0], budget)
    again, _ = _search(name, _problem(gradients=8)[0], budget)
    for outcome in (first, again):
        assert outcome.evaluations <= 25
    assert (again.best, again.best_ms, again.top) == (first.best, first.best_ms, first.top)
    assert (again.curve, again.evaluations) == (first.curve, first.evaluations)


@pytest.mark.parametrize("name", STUDY_ALGORITHMS)
def test_extra_workers_join_the_study_and_count(name: str) -> None:
    problem, _ = _problem(fusion_only=False)
    shared: list[SharedStudy] = []
    helped: list[FakeEvaluator] = []

    def build() -> SearchProblem:
        joined, fake = _problem(fusion_only=False)
        helped.append(fake)
        return joined

    @contextlib.contextmanager
    def helpers(study: SharedStudy) -> Iterator[None]:
        # A process would run beside the search; here it runs the study to its target first.
        shared.append(study)
        worker = search_algorithm(name)
        assert isinstance(worker, OptunaSearch)
        worker.work(study, build, worker=1)
        yield

    algorithm = search_algorithm(name, helpers=helpers)
    outcome = algorithm.search(problem, SearchBudget(evaluations=20, time_limit_s=60))
    (study,) = shared
    assert study.sampler == name and study.target_trials == 20
    assert study.storage.startswith("journal://")  # no storage given: a temporary journal
    (fake,) = helped
    # the worker's trials are the search's: the budget counts them, the outcome holds them
    assert 0 < fake.evaluations <= 20 and fake.evaluations <= outcome.evaluations <= 21
    other = search_algorithm("cmaes" if name != "cmaes" else "tpe")
    assert isinstance(other, OptunaSearch)
    with pytest.raises(InvalidOptionError, match="cannot join"):
        other.work(study, build, worker=2)


def test_each_registered_algorithm_answers_to_its_name() -> None:
    assert list(ALGORITHMS) == ["backtrack", "tpe", "cmaes", "nsga2", "random", "autotune"]
    for name, cls in ALGORITHMS.items():
        assert cls.name == name and search_algorithm(name).name == name


def test_an_unknown_algorithm_is_refused_with_the_choices() -> None:
    with pytest.raises(InvalidOptionError, match="'annealing'") as refused:
        search_algorithm("annealing")
    for name in ALGORITHMS:
        assert name in str(refused.value)


def test_autotune_needs_live_runs() -> None:
    problem, _ = _problem()
    unmeasured = SearchProblem(
        evaluator=problem.evaluator, space=problem.space, order=problem.order, sizes=problem.sizes
    )
    with pytest.raises(InvalidOptionError, match="measure"):
        search_algorithm("autotune").search(unmeasured, SearchBudget(evaluations=2))


def test_budgets_and_problems_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match=r"evaluations\(0\)"):
        SearchBudget(evaluations=0)
    problem, _ = _problem(fusion_only=False)
    with pytest.raises(InvalidOptionError, match="fusion-only"):
        SearchProblem(
            evaluator=problem.evaluator,
            space=problem.space,
            order=problem.order,
            sizes=problem.sizes,
            fusion_only=True,
        )
    with pytest.raises(InvalidOptionError, match="differ"):
        SearchProblem(evaluator=problem.evaluator, space=problem.space, order=["g0"], sizes=[])
