"""``ddlsim demo``: a small end-to-end pipeline through a running service's REST API.

Profile (a model's kernels at a rank's micro-batch, the link's collectives), predict (DDP's
defaults and DeAR), search every plan (backtracking) and settle the answer by measurement (the
first three candidates and DDP's defaults run side by side on emulated ranks: a candidate is the
answer only if it beat DDP's defaults beyond the noise), then run the answer once more with a
trace. Every step is a request to the service and every result lands in its store, so the
dashboard shows the runs against their predictions and one run's timeline beside its trace.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from ddlsim.data.errors import DdlsimError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.service.cmd_serve import default_token_file, load_token
from ddlsim.service.output import describe, verification_lines
from ddlsim.simulator.costs import rank_spec

POLL_S = 1.0


class ServiceError(DdlsimError, RuntimeError):
    """The service refused a request or a job failed."""


class Client:
    """A small JSON client of the service's API."""

    def __init__(self, url: str, token: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call("POST", path, body or {})

    def wait(self, job: dict[str, Any], what: str) -> dict[str, Any]:
        """Poll a job until it ends; its result, or ``ServiceError`` naming its error."""
        deadline = time.monotonic() + self.timeout_s
        shown = ""
        while True:
            job = self.get(f"/v1/jobs/{job['id']}")
            line = f"  {what}: {job['status']} {100 * job['progress']:.0f}% {job['message'] or ''}"
            if line != shown:
                print(line[:110], file=sys.stderr, flush=True)
                shown = line
            if job["status"] == "done":
                return dict(job["result"])
            if job["status"] in ("failed", "cancelled"):
                raise ServiceError(f"{what} job {job['id']} {job['status']}: {job['error']}")
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"{what} job {job['id']} still {job['status']} after the timeout"
                )
            time.sleep(POLL_S)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ServiceError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise ServiceError(
                f"{method} {path}: {exc.reason} (is `ddlsim serve` running?)"
            ) from None


def run_demo(
    client: Client,
    *,
    model: str,
    world_size: int,
    bandwidth: str,
    measure_budget_s: float = 20.0,
    profile_repeats: int | None = None,
) -> dict[str, Any]:
    """Profile, predict, search and verify ``model`` through the service; the verifying runs
    take ``measure_budget_s`` seconds a strategy beyond their minimum steps. The profiling
    jobs time 10 kernel iterations and each collective as the collectives job does by default,
    or each of them ``profile_repeats`` times.

    Long: the demo's requests in the order a user makes them, each printed as it ends.
    """
    spec = ZOO[model]
    micro = rank_spec(spec, Strategy(), world_size).inputs.batch_size
    print(f"1. profiling {model} at batch {micro} and the {bandwidth} link", file=sys.stderr)
    repeats: dict[str, int] = {}
    if profile_repeats is not None:
        repeats = {"repeats": profile_repeats, "cpu_repeats": profile_repeats}
    run = client.post(
        "/v1/profiling-runs",
        {
            "jobs": [
                {
                    "kind": "kernels",
                    "model": model,
                    "batch_size": micro,
                    "iters": profile_repeats or 10,
                },
                {
                    **repeats,
                    "kind": "collectives",
                    "world_size": world_size,
                    "bandwidth": bandwidth,
                    # what the plans of the search's space send: DDP's all-reduce, DeAR's
                    # ring, FSDP's and tensor parallelism's collectives, pipelines' sends
                    "collectives": [
                        "all_reduce",
                        "ring_reduce_scatter",
                        "ring_all_gather",
                        "reduce_scatter",
                        "all_gather",
                        "sendrecv",
                    ],
                    "sizes": [65536, 1048576, 4194304, 16777216],
                },
            ]
        },
    )
    client.wait(run, "profiling")
    print("2. predicting DDP's defaults and DeAR", file=sys.stderr)
    cluster = {"model": model, "world_size": world_size, "bandwidth": bandwidth}
    dear = {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}}
    predicted = {
        "DDP defaults": client.post("/v1/predictions", cluster)["iteration_time_ms"],
        "DeAR, 1 MB buckets": client.post("/v1/predictions", {**cluster, "strategy": dear})[
            "iteration_time_ms"
        ],
    }
    print(
        "3. searching every plan (parallel layouts, tensor and op fusion); the first three "
        "candidates and DDP's defaults run side by side, and what they measure decides",
        file=sys.stderr,
    )
    search = client.post(
        "/v1/strategy-requests",
        {
            **cluster,
            "space": "all",
            "budget": 500,
            "algo": "backtrack",
            "verify": True,
            "verify_top": 3,
            "iters": 5,
            "measure_budget_s": measure_budget_s,
        },
    )
    found = client.wait(search, "search")
    print(
        "4. running the answer once more with a trace, beside its replayed timeline",
        file=sys.stderr,
    )
    execution = client.post(
        "/v1/executions",
        {
            **cluster,
            "strategy": found["best"]["strategy"],
            "iters": 5,
            "measure_budget_s": 0,
            "trace": True,
        },
    )
    executed = client.wait(execution, "execution")
    return {"predicted": predicted, "search": found, "execution": executed}


def cmd_demo(args: argparse.Namespace) -> int:
    token = args.token or load_token(default_token_file())[0]
    client = Client(args.url, token)
    out = run_demo(client, model=args.model, world_size=args.world_size, bandwidth=args.bandwidth)
    search = out["search"]
    print(
        f"\n{args.model} on {args.world_size} ranks at {args.bandwidth}:\n"
        f"  predicted    DDP defaults {out['predicted']['DDP defaults']:.1f} ms, "
        f"DeAR {out['predicted']['DeAR, 1 MB buckets']:.1f} ms\n"
        f"  search       {search['evaluations']} strategies in {search['elapsed_s']:.1f} s: best "
        f"{search['best']['predicted_ms']:.1f} ms predicted, "
        f"{describe(search['best']['strategy'])}"
    )
    for line in verification_lines(search):
        print(f"  measured     {line}")
    executed = out["execution"]
    print(
        f"  traced       the answer once more: {executed['measured_ms']:.1f} ms measured, "
        f"{executed['predicted_ms']:.1f} ms predicted"
    )
    print(f"\ndashboard: {args.url.rstrip('/')}/")
    return 0


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="an end-to-end pipeline through a running service")
    demo.add_argument("--url", default="http://127.0.0.1:8000")
    demo.add_argument("--token", help="the API token (default: the token file's)")
    demo.add_argument("--model", default="gpt2-tiny", choices=sorted(ZOO))
    demo.add_argument("--world-size", type=int, default=2)
    demo.add_argument("--bandwidth", default="1gbit")
    demo.set_defaults(handler=cmd_demo)
