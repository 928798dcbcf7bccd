"""The simulator's accuracy figures on the shipped datasets, per plan kind and world size, and
the file that holds them for the test command (``tests/simulator/accuracy_figures.json``).

For every shipped dataset (and its sessions) and two cost models, the replay alone and the
shipped checkpoint: the median signed error, the MAPE, the pair accuracy within a launch and the
error of the speed-up over DDP's defaults of the same launch (``ddlsim.simulator.figures``).
Deterministic: no measurement, about a minute on the 2-core VM.

    .venv/bin/python benchmarks/accuracy_figures.py                 # the table, and what moved
    .venv/bin/python benchmarks/accuracy_figures.py --write --reason "why the figures moved"

``--write`` replaces the recorded figures: do it on purpose, in a commit of its own that says
why they moved (``tests/simulator/test_accuracy_figures.py`` fails until then).
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

from ddlsim.simulator.cost_model import CostModel, ReplayCostModel, load_cost_model
from ddlsim.simulator.dataset import load_dataset
from ddlsim.simulator.default import shipped_checkpoint
from ddlsim.simulator.figures import MARGINS, accuracy_figures, compare_figures

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT / "ddlsim" / "data" / "datasets"
RECORDED = ROOT / "tests" / "simulator" / "accuracy_figures.json"
SHIPPED_DATASETS = ("cpu-v2.json.gz", "cpu-v3.json.gz")


def cost_models() -> dict[str, CostModel]:
    return {"replay": ReplayCostModel(), "shipped": load_cost_model(str(shipped_checkpoint()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"replace {RECORDED.name}")
    parser.add_argument("--reason", help="with --write: why the figures moved (kept in the file)")
    args = parser.parse_args()
    if args.write and not args.reason:
        parser.error("--write needs --reason")
    recorded = json.loads(RECORDED.read_text()) if RECORDED.is_file() else {"datasets": {}}
    models = cost_models()
    payload: dict[str, dict[str, dict[str, object]]] = {}
    moved = []
    for name in SHIPPED_DATASETS:
        figures = accuracy_figures(load_dataset(DATASETS / name), models)
        payload[name] = {
            model: {key: row.to_json() for key, row in rows.items()}
            for model, rows in figures.items()
        }
        for model, rows in figures.items():
            print(f"\n{name}, {model}\n")
            print(
                "| kind | ranks | runs | median error | MAPE | pairs right | speed-up error "
                "median | p90 |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for key, row in rows.items():
                kind, world = key.split("|")
                pairs = "-" if row.pair_accuracy is None else f"{row.pair_accuracy:.2f}"
                median = "-" if row.speedup_median is None else f"{row.speedup_median:.3f}"
                p90 = "-" if row.speedup_p90 is None else f"{row.speedup_p90:.3f}"
                print(
                    f"| {kind} | {world} | {row.runs} | {row.median_error:+.3f} | "
                    f"{row.mape:.3f} | {pairs} ({row.pairs}) | {median} | {p90} |"
                )
            before = recorded["datasets"].get(name, {}).get(model, {})
            moved += [f"{name} {model} {line}" for line in compare_figures(before, rows)]
    print(
        "\nMoved beyond the margins against the recorded figures:"
        if moved
        else "\nNothing moved beyond the margins."
    )
    for line in moved:
        print(f"  {line}")
    if args.write:
        RECORDED.write_text(
            json.dumps(
                {
                    "recorded": datetime.date.today().isoformat(),
                    "reason": args.reason,
                    "margins": MARGINS,
                    "datasets": payload,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n",
            encoding="utf-8",
        )
        print(f"wrote {RECORDED}")
    elif moved:
        sys.exit(1)


if __name__ == "__main__":
    main()
