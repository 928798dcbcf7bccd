"""``ddlsim predict MODEL --strategy S --world-size N``: the simulator's iteration time, stored
(:mod:`ddlsim.workflows.predict`)."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ddlsim.data.store import mask_url
from ddlsim.service import cmd_scale, output
from ddlsim.simulator.predict import Prediction
from ddlsim.workflows.predict import predict
from ddlsim.workflows.requests import OPTIMIZERS, PredictRequest, defaults

DEFAULTS = defaults(PredictRequest)


def cmd_predict(args: argparse.Namespace) -> int:
    if cmd_scale.gpu_cluster(args) is not None:
        return cmd_scale.predict_on_cluster(args)
    request = output.request_from(args, PredictRequest, strategy=output.strategy_argument(args))
    done = output.run_on_store(args, predict, request)
    prediction = done.prediction
    if args.trace:
        Path(args.trace).write_text(json.dumps(prediction.result.chrome_trace()), "utf-8")
    payload = {
        **prediction.to_json(),
        "model": request.model.label,
        "rank_batch_size": prediction.graph.model.inputs.batch_size,
        "kernel_profile": {"id": done.profile.id, "profiled_now": done.profiled_now},
        "id": done.prediction_id,
        "db": mask_url(done.store_url),
    }
    if args.json:
        output.emit_json(payload)
    else:
        _print_summary(prediction, payload)
    return 0


def _print_summary(prediction: Prediction, payload: dict[str, Any]) -> None:
    parts = prediction.breakdown()
    print(
        f"{payload['model']} on {prediction.world_size} rank(s), {prediction.bandwidth}: "
        f"{prediction.iteration_time_ms:.1f} ms per iteration ({prediction.simulator_version})\n"
        f"  replay        {prediction.replay_ms:.1f} ms (predictor: {prediction.predictor})\n"
        f"  compute       {parts['compute_ms']:.1f} ms\n"
        f"  exposed comm  {parts['exposed_comm_ms']:.1f} ms "
        f"(of {parts['comm_ms']:.1f} ms communicating)\n"
        f"  collectives   "
        + "; ".join(f"{op}: {src}" for op, src in payload["collective_models"].items())
        + "".join(
            f"\n  compiled      {block}: {eager:.2f} ms eager, {compiled:.2f} ms fused (predicted)"
            for block, eager, compiled in prediction.fused_blocks
        )
        + f"\n  stored        prediction {payload['id']} in {payload['db']}",
        file=sys.stdout,
    )


def register(sub: Any) -> None:
    cmd = sub.add_parser("predict", help="predict a strategy's iteration time with the simulator")
    output.add_input_arguments(cmd)
    output.add_launch_arguments(
        cmd,
        DEFAULTS,
        "link rate per host (1gbit, 100mbit, none); collective fits of this link are used",
    )
    cmd.add_argument("--optimizer", default=DEFAULTS["optimizer"], choices=OPTIMIZERS)
    output.add_prediction_arguments(cmd, profile_iters=DEFAULTS["profile_iters"])
    cmd.add_argument("--trace", help="write the replayed timeline here (Chrome trace JSON)")
    cmd_scale.add_cluster_arguments(cmd, with_plan=True)
    output.add_store_arguments(cmd)
    cmd.set_defaults(handler=cmd_predict)
