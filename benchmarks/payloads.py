"""The same payloads before and after a restructuring, side by side in one run.

``dump`` prints, as one JSON object, what the tree it runs in answers to a fixed set of
requests: CPU predictions of 14 strategies (every plan kind, 2 and 4 ranks), two searches (the
backtracking over every plan, TPE over fusion), GPU-cluster predictions of 8 layouts and one
cluster search, the published rows of one file, and the losses and applied plans of 4 real runs
on 2 ranks. Times that are measured (runs' iteration times, searches' elapsed seconds) and
store ids are left out; everything else must be equal.

``compare --before TREE`` runs ``dump`` in the tree at ``TREE`` (a ``git worktree`` of the
commit before the change, imported through ``PYTHONPATH``) and in this one, in turns
(before, after, after, before), each on its own copy of one prepared store, and reports
whether every payload was equal, and if not the first keys that differ.

    git worktree add /tmp/before COMMIT
    python benchmarks/payloads.py compare --before /tmp/before --out payloads.json

Time: about 4 minutes a dump on the 2-core VM (the runs take 2 of them; each request is a
``ddlsim`` process of its own, as a user runs it).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
# (model, world size, global batch or None for the zoo's, strategy)
CPU_STRATEGIES: list[tuple[str, int, int | None, dict[str, Any]]] = [
    ("gpt2-tiny", 2, None, {}),
    ("gpt2-tiny", 2, None, {"tensor_fusion": {"bucket_cap_mb": 4}}),
    ("gpt2-tiny", 2, None, {"tensor_fusion": {"dear": True}}),
    (
        "gpt2-tiny",
        2,
        None,
        {"tensor_fusion": {"implementation": "hooks", "bucket_caps_mb": [1, 8]}},
    ),
    ("gpt2-tiny", 2, None, {"parallel": {"fsdp": True}}),
    ("gpt2-tiny", 2, None, {"parallel": {"micro_batches": 2}}),
    ("gpt2-tiny", 2, None, {"parallel": {"tp": 2}}),
    ("gpt2-tiny", 2, None, {"parallel": {"tp": 2, "grid": [1, 2, 1]}}),
    ("gpt2-tiny", 2, None, {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}}),
    ("gpt2-tiny", 2, None, {"op_fusion": {"compiled": ["transformer.h.0"]}}),
    ("gpt2-tiny", 4, 8, {}),
    ("gpt2-tiny", 4, 8, {"parallel": {"pp": 2, "micro_batches": 2}}),
    ("gpt2-tiny", 4, 8, {"parallel": {"pp": 2, "micro_batches": 2, "stages": ["tp", "batch"]}}),
    (
        "bert-small",
        2,
        8,
        {
            "parallel": {
                "pp": 2,
                "micro_batches": 2,
                "pp_schedule": "interleaved_1f1b",
                "virtual_stages": 2,
            }
        },
    ),
]
GPU_PLANS: list[dict[str, Any]] = [
    {"parallel": {"tp": 8}, "precision": "bf16"},
    {"parallel": {"tp": 4, "pp": 2, "micro_batches": 8}, "precision": "bf16"},
    {"parallel": {"tp": 2, "fsdp": True}, "precision": "bf16"},
    {
        "parallel": {"tp": 8, "sequence_parallel": True, "recompute": "selective"},
        "precision": "bf16",
    },
    {"parallel": {"tp": 4, "cp": 2}, "precision": "bf16"},
    {"parallel": {"tp": 8, "distributed_optimizer": True}, "precision": "fp8"},
    {
        "parallel": {
            "tp": 4,
            "pp": 4,
            "micro_batches": 8,
            "pp_schedule": "interleaved_1f1b",
            "virtual_stages": 2,
        },
        "precision": "bf16",
    },
    {"parallel": {"tp": 8, "async_tp": True}, "precision": "bf16", "compile": True},
]
RUNS: list[dict[str, Any]] = [
    {"tensor_fusion": {"bucket_cap_mb": 4}},
    {"parallel": {"tp": 2}},
    {"parallel": {"pp": 2, "micro_batches": 2}},
    {"parallel": {"fsdp": True}},
]
VOLATILE = {"elapsed_s", "seconds", "id", "db", "created_at", "wall_s", "profiled_now"}


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _cli(args: list[str]) -> Any:
    """``ddlsim ARGS --json`` (the tree ``PYTHONPATH`` names); its JSON output, or its exit
    status where it refused."""
    done = subprocess.run(
        [sys.executable, "-m", "ddlsim", *args, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return {"exit": done.returncode}
    return json.loads(done.stdout)


def _run_payload(db: str, strategy: dict[str, Any]) -> Any:
    payload = _cli(
        [
            "run",
            "gpt2-tiny",
            "--world-size",
            "2",
            "--strategy",
            json.dumps(strategy),
            "--iters",
            "4",
            "--warmup",
            "1",
            "--measure-budget",
            "0",
            "--db",
            db,
        ]
    )
    if "losses" not in payload:
        return payload
    return {"losses": [round(x, 5) for x in payload["losses"]], "applied": payload.get("applied")}


def _cmd(text: str, *extra: str) -> Any:
    """``ddlsim`` with the words of ``text`` and ``extra``, its JSON cleaned of what varies."""
    return _clean(_cli([*text.split(), *extra]))


def dump(db: str, *, runs: bool) -> dict[str, Any]:
    """Every payload of the fixed requests, against ``db``."""
    out: dict[str, Any] = {"predict": [], "cluster": []}
    for model, world, batch, strategy in CPU_STRATEGIES:
        sized = "" if batch is None else f" --batch-size {batch}"
        request = f"predict {model} --world-size {world} --bandwidth 1gbit{sized} --db {db}"
        out["predict"].append(_cmd(request, "--strategy", json.dumps(strategy)))
    out["search"] = _cmd(
        f"search gpt2-tiny --world-size 2 --bandwidth 1gbit --budget 300 --db {db}"
    )
    out["search_tpe"] = _cmd(
        "search llama-tiny --world-size 2 --bandwidth 1gbit --budget 60 --algo tpe "
        f"--space fusion --db {db}"
    )
    for plan in GPU_PLANS:
        request = (
            f"predict mistral-7b --cluster dgx-h100:2 --batch-size 16 --seq-len 4096 --db {db}"
        )
        out["cluster"].append(_cmd(request, "--plan", json.dumps(plan)))
    out["cluster_search"] = _cmd(
        "search mistral-7b --cluster dgx-h100:4 --batch-size 64 --seq-len 4096"
    )
    rows = "ddlsim/data/published/megatron_lm_h100.json"
    # The tree being dumped is the working directory (``compare`` runs each dump in its own).
    published = subprocess.run(
        [sys.executable, str(Path.cwd() / "benchmarks/published.py"), rows, "--json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=os.getcwd(),
    )
    out["published"] = (
        _clean(json.loads(published.stdout))
        if published.returncode == 0
        else {"exit": published.returncode, "stderr": published.stderr[-500:]}
    )
    if runs:
        out["runs"] = [_run_payload(db, strategy) for strategy in RUNS]
    return out


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, dict):
        keys = sorted(set(a) | set(b))
        found: list[str] = []
        for key in keys:
            if key not in a or key not in b:
                found.append(f"{path}.{key}: only in {'after' if key in b else 'before'}")
            else:
                found += _differences(a[key], b[key], f"{path}.{key}")
        return found
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def compare(before: Path, out: Path | None, runs: bool) -> int:
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "base.db"
        # the store both trees read: kernel profiles taken once, here, by a first dump
        print("preparing the store (kernel profiles) ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, __file__, "dump", "--db", f"sqlite:///{base}", "--no-runs"],
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(HERE)},
            check=True,
            cwd=HERE,
        )
        dumps: dict[str, list[Any]] = {"before": [], "after": []}
        for which in ("before", "after", "after", "before"):
            copy = Path(folder) / f"{which}-{len(dumps[which])}.db"
            shutil.copy(base, copy)
            # each tree imported from its own folder (not the installed one, which may be
            # either), and run in it: ``python -m ddlsim`` puts the working directory first on
            # its path, so a dump run in the other tree would import that tree's package
            tree = before if which == "before" else HERE
            env = {**os.environ, "PYTHONPATH": str(tree)}
            print(f"dumping {which} ...", file=sys.stderr)
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "dump",
                    "--db",
                    f"sqlite:///{copy}",
                    *([] if runs else ["--no-runs"]),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=True,
                cwd=tree,
            )
            dumps[which].append(json.loads(done.stdout))
    pairs = [
        ("before 1", dumps["before"][0], "after 1", dumps["after"][0]),
        ("before 2", dumps["before"][1], "after 2", dumps["after"][1]),
        ("after 1", dumps["after"][0], "after 2", dumps["after"][1]),
    ]
    report = {}
    sections: dict[str, dict[str, int]] = {}
    for name_a, a, name_b, b in pairs:
        found = _differences(a, b)
        report[f"{name_a} vs {name_b}"] = found[:20]
        # differences by payload (predict, search, cluster, published, runs...)
        sections[f"{name_a} vs {name_b}"] = {
            key: sum(1 for line in found if line.startswith(f".{key}"))
            for key in sorted(set(a) | set(b))
        }
        print(f"{name_a} vs {name_b}: {'equal' if not found else f'{len(found)} differences'}")
        print(f"  by payload: {sections[f'{name_a} vs {name_b}']}")
        for line in found[:10]:
            print(f"  {line}")
    if out is not None:
        out.write_text(
            json.dumps(
                {
                    "report": report,
                    "by_payload": sections,
                    "payload": dumps["after"][0],
                    "before_payload": dumps["before"][0],
                },
                indent=1,
            )
        )
    return 0 if all(not v for v in report.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("dump", help="print this tree's payloads")
    one.add_argument("--db", required=True)
    one.add_argument("--no-runs", action="store_true", help="leave out the real runs")
    both = sub.add_parser("compare", help="this tree against --before, side by side")
    both.add_argument("--before", required=True, help="the tree before the change")
    both.add_argument("--out", help="write the report and one payload (JSON)")
    both.add_argument("--no-runs", action="store_true", help="leave out the real runs")
    args = parser.parse_args()
    if args.command == "dump":
        print(json.dumps(dump(args.db, runs=not args.no_runs), sort_keys=True))
        return 0
    return compare(Path(args.before), Path(args.out) if args.out else None, not args.no_runs)


if __name__ == "__main__":
    raise SystemExit(main())
