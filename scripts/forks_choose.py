"""The tuning stage's choices for experiment=forks_oracle (issue #36 §4), from experiment=forks_oracle_tune sweeps on
the validation graph: each arm's learning rate, the oracle's token budget and ICT's matching ratio, written into a
config the study composes (`forks_tuned=tuned`).

    python scripts/forks_choose.py logs/forks_oracle_tune/multiruns/<t1> [<t2> ...] --out configs/forks_tuned/tuned.yaml

- lr: per arm (`forks_arm`), the grid point (`algorithm.optimizer.lr`) with the highest held-out pass@1 after
  training on the validation graph's routes, averaged over the complete runs at that point; a tie goes to the smaller
  lr. Only complete runs count.
- budget: the oracle's share of updated response tokens (`select/fraction`, mean over its steps) at its chosen lr:
  20-Entropy's batch ratio.
- ratio: ict / random keep ⌈ratio·T⌉ tokens of a response of T tokens (selectors/ranking.py), so the ratio that
  updates `budget` of the tokens depends on the lengths: the grid value r ∈ {0.01, …, 0.99} whose Σ⌈r·T_i⌉ / Σ T_i
  over every response the oracle's runs recorded (samples/step_*.jsonl) is closest to the budget (a tie: the smaller).

Arms the given sweeps do not hold keep the values already in --out (stage 2 adds to stage 1's file); `tuned` is true
once every arm of configs/forks_arm/ has a chosen lr. A bad input is one `error:` line and exit status 2.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokenrl.cli.errors import OneLineParser  # noqa: E402
from tokenrl.report.runs import Run, final_validation, load_sweep  # noqa: E402

ARMS = sorted(p.stem for p in (ROOT / "configs" / "forks_arm").glob("*.yaml"))
UNTUNED = ROOT / "configs" / "forks_tuned" / "untuned.yaml"
LR_KEY = "algorithm.optimizer.lr"


class FlowListDumper(yaml.SafeDumper):
    """Lists on one line (`[a, b]`): the config reference (scripts/config_reference.py) reads list items only under
    `defaults:`."""


FlowListDumper.add_representer(
    list, lambda dumper, value: dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)
)


def choose_lrs(runs: list[Run]) -> dict[str, dict]:
    """arm → {"lr": chosen, "grid": {lr: [mean held-out pass@1, n runs]}} over the complete runs."""
    table: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        if not run.complete or "forks_arm" not in run.overrides or LR_KEY not in run.overrides:
            continue
        value = final_validation(run).get("val/pass@1", math.nan)
        if not math.isnan(value):
            table.setdefault(run.overrides["forks_arm"], {}).setdefault(float(run.overrides[LR_KEY]), []).append(value)
    chosen = {}
    for arm, grid in table.items():
        means = {lr: sum(v) / len(v) for lr, v in grid.items()}
        best = min(means, key=lambda lr: (-means[lr], lr))
        chosen[arm] = {"lr": best, "grid": {lr: [round(means[lr], 6), len(grid[lr])] for lr in sorted(grid)}}
    return chosen


def response_lengths(run: Run) -> list[int]:
    return [
        len(json.loads(line)["tokens"])
        for path in sorted((run.folder / "samples").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def matching_ratio(budget: float, lengths: list[int]) -> float:
    """The r ∈ {0.01, …, 0.99} whose ⌈r·T⌉ per response (at least 1) updates the share of tokens closest to budget."""
    total = sum(lengths)

    def share(r: float) -> float:
        return sum(max(1, math.ceil(round(r * t, 9))) for t in lengths) / total

    return min((i / 100 for i in range(1, 100)), key=lambda r: (abs(share(r) - budget), r))


def oracle_budget(runs: list[Run], lr: float) -> tuple[float, float, int]:
    """(budget, ratio, responses) from the oracle's complete runs at its chosen lr."""
    oracle = [
        run
        for run in runs
        if run.complete and run.overrides.get("forks_arm") == "oracle" and float(run.overrides[LR_KEY]) == lr
    ]
    fractions = [
        values["select/fraction"] for run in oracle for values in run.steps.values() if "select/fraction" in values
    ]
    lengths = [t for run in oracle for t in response_lengths(run)]
    if not fractions or not lengths:
        raise ValueError("the oracle's runs logged no select/fraction or recorded no samples: cannot set the budget")
    budget = sum(fractions) / len(fractions)
    return budget, matching_ratio(budget, lengths), len(lengths)


def main() -> None:
    parser = OneLineParser(prog="python scripts/forks_choose.py", description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="experiment=forks_oracle_tune multirun folders")
    parser.add_argument("--out", type=Path, required=True, help="the config to write (configs/forks_tuned/tuned.yaml)")
    args = parser.parse_args()
    try:
        runs = [run for folder in args.folders for run in load_sweep(folder)]
        chosen = choose_lrs(runs)
        if not chosen:
            raise ValueError("no complete run with forks_arm and algorithm.optimizer.lr overrides: not a tuning sweep")
        base = yaml.safe_load((args.out if args.out.is_file() else UNTUNED).read_text())
        lrs = {**base["lr"], **{arm: entry["lr"] for arm, entry in chosen.items()}}
        grids = {**(base.get("grid") or {}), **{arm: entry["grid"] for arm, entry in chosen.items()}}
        done = sorted(set(base.get("chosen_arms") or []) | set(chosen))
        budget, ratio, responses = base["budget"], base["ratio"], base.get("responses")
        if "oracle" in chosen:
            budget, ratio, responses = oracle_budget(runs, chosen["oracle"]["lr"])
        sources = [str(folder) for folder in args.folders]
        config = {
            "tuned": set(done) >= set(ARMS),
            "source": sorted(set(base.get("source") or []) | set(sources)),
            "budget": round(budget, 4),
            "ratio": ratio,
            "responses": responses,
            "lr": lrs,
            "chosen_arms": done,
            "grid": grids,
        }
    except (FileNotFoundError, ValueError, KeyError) as err:
        parser.exit(2, f"error: {err}\n")
    header = (
        "# Written by scripts/forks_choose.py from the tuning sweeps on the validation graph (`source`); do not edit.\n"
        f"#   python scripts/forks_choose.py {' '.join(config['source'])} --out {args.out}\n"
        "# lr: per arm, the grid point with the highest held-out pass@1 (grid: lr → [mean, runs]); budget: the\n"
        "# oracle's share of updated tokens; ratio: ict's / random's ⌈ratio·T⌉ that matches it over `responses`.\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        header + yaml.dump(config, Dumper=FlowListDumper, sort_keys=False, allow_unicode=True, width=1000)
    )
    missing = sorted(set(ARMS) - set(done))
    print(
        f"{args.out}: lr {', '.join(f'{a} {lrs[a]:g}' for a in done)}; budget {config['budget']}, ratio {ratio}"
        + (f"; still untuned: {', '.join(missing)}" if missing else "; every arm tuned")
    )


if __name__ == "__main__":
    main()
