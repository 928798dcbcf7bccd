"""A pipeline schedule replayed over its stages: GPipe, 1F1B and interleaved 1F1B.

Each of ``stages`` GPUs holds ``chunks`` model chunks (chunk ``c`` of stage ``s`` is the
model's part ``c * stages + s``, as Megatron-LM's interleaved schedule places them) and runs its
forward and backward passes of ``micro_batches`` micro-batches in the schedule's order. An op
starts when its GPU is free and its input has arrived: a forward's activation from the previous
part plus the send between GPUs, a backward's gradient from the next part (the last part's
backward follows its own forward). The iteration's pipeline time is when the last GPU ends.
"""

import dataclasses
from collections.abc import Callable, Sequence

from ddlsim.data.errors import InvalidStrategyError

Op = tuple[str, int, int]  # ("f" | "b", chunk, micro-batch)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StageTimes:
    """Per stage and chunk: forward and backward ms of one micro-batch; ``first_forward_ms`` and
    ``last_backward_ms`` replace them for the first micro-batch's forward and the last one's
    backward (where a sharded stage gathers its weights or reduces its gradients)."""

    forward_ms: Sequence[Sequence[float]]
    backward_ms: Sequence[Sequence[float]]
    first_forward_ms: Sequence[Sequence[float]] | None = None
    last_backward_ms: Sequence[Sequence[float]] | None = None


def schedule_order(
    kind: str, stage: int, stages: int, chunks: int, micro_batches: int
) -> list[Op]:
    """The order one stage runs its ops in.

    Raises:
        InvalidStrategyError: for an unknown schedule, or interleaving whose micro-batches are
            not a multiple of the stages.
    """
    m, p, v = micro_batches, stages, chunks
    if kind == "gpipe":
        return [("f", 0, i) for i in range(m)] + [("b", 0, i) for i in range(m)]
    if kind == "1f1b" and v == 1:
        warmup = min(p - stage - 1, m)
        order: list[Op] = [("f", 0, i) for i in range(warmup)]
        f_next, b_next = warmup, 0
        while b_next < m:
            if f_next < m:
                order.append(("f", 0, f_next))
                f_next += 1
            order.append(("b", 0, b_next))
            b_next += 1
        return order
    if kind == "interleaved" or (kind == "1f1b" and v > 1):
        if m % p:
            raise InvalidStrategyError(
                f"the interleaved schedule needs micro_batches({m}) to be a multiple of pp({p})"
            )
        total = m * v

        def forward(k: int) -> Op:
            return ("f", (k // p) % v, (k // (p * v)) * p + k % p)

        def backward(k: int) -> Op:
            return ("b", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)

        warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
        order = [forward(k) for k in range(warmup)]
        f_next, b_next = warmup, 0
        while b_next < total:
            if f_next < total:
                order.append(forward(f_next))
                f_next += 1
            order.append(backward(b_next))
            b_next += 1
        return order
    raise InvalidStrategyError(
        f"pipeline schedule {kind!r} is not supported; allowed: gpipe, 1f1b, interleaved"
    )


def replay_pipeline(
    kind: str,
    times: StageTimes,
    *,
    micro_batches: int,
    send_ms: float | Callable[[int, int], float] = 0.0,
) -> list[float]:
    """Replay the schedule; the ms at which each stage finishes its last op.

    ``send_ms`` is the time an activation (or its gradient) takes from one part to the next,
    or a function of the two stages it goes between.

    Shapes:
        times.forward_ms: [stages, chunks]
    """
    p = len(times.forward_ms)
    v = len(times.forward_ms[0])
    m = micro_batches
    orders = [schedule_order(kind, s, p, v, m) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, part, micro-batch) -> end ms
    free = [0.0] * p
    position = [0] * p
    parts = p * v

    def send(a: int, b: int) -> float:
        if a == b:
            return 0.0
        return send_ms(a, b) if callable(send_ms) else send_ms

    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                kind_op, chunk, mb = orders[s][position[s]]
                part = chunk * p + s
                if kind_op == "f":
                    if part == 0:
                        ready = 0.0
                    else:
                        prev = done.get(("f", part - 1, mb))
                        if prev is None:
                            break
                        ready = prev + send((part - 1) % p, s)
                    table = times.first_forward_ms if mb == 0 else None
                    duration = (table or times.forward_ms)[s][chunk]
                else:
                    if part == parts - 1:
                        prev = done.get(("f", part, mb))
                        if prev is None:
                            break
                        ready = prev
                    else:
                        prev = done.get(("b", part + 1, mb))
                        if prev is None:
                            break
                        ready = prev + send((part + 1) % p, s)
                    table = times.last_backward_ms if mb == m - 1 else None
                    duration = (table or times.backward_ms)[s][chunk]
                start = max(free[s], ready)
                free[s] = start + duration
                done[(kind_op, part, mb)] = free[s]
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise InvalidStrategyError(
                f"pipeline schedule {kind!r} deadlocks with {p} stages, {v} chunks, "
                f"{m} micro-batches"
            )
    return free


def analytic_pipeline_ms(
    kind: str,
    forward_ms: float,
    backward_ms: float,
    *,
    stages: int,
    chunks: int,
    micro_batches: int,
    send_ms: float,
) -> float:
    """The replay's result for equal stages in closed form: the micro-batches' work plus the
    bubble, ``(p - 1) / v`` micro-batches' worth, plus the sends along the critical path."""
    p, v, m = stages, chunks, micro_batches
    per_mb = forward_ms + backward_ms
    bubble = (p - 1) * per_mb / v if kind != "gpipe" or v == 1 else (p - 1) * per_mb
    return m * per_mb + bubble + 2 * (p - 1) * send_ms
