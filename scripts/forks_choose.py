"""The tuning stage's choices for experiment=forks_oracle (issue #36 §4) and experiment=forks_mechanism (issue #48),
from their tuning sweeps on validation graphs: each arm's learning rate, the oracle's token budget and ICT's matching
ratio, written into a config the study composes (`forks_tuned=tuned`, `forks_tuned=mechanism`).

    python scripts/forks_choose.py logs/forks_oracle_tune/multiruns/<t1> [<t2> ...] --out configs/forks_tuned/tuned.yaml
    python scripts/forks_choose.py <t1> [<t2> ...] --metric pass@1_auc --arms uniform oracle ... --out <file>
    python scripts/forks_choose.py --difficulty logs/forks_mechanism_scan/multiruns/<t0>

- lr: per arm (`forks_arm`), the grid point (`algorithm.optimizer.lr`) with the highest `--metric` (a contrast
  metric of report/contrasts.py: held-out pass@1 after training by default, `pass@1_auc` its curve's AUC), averaged
  over the complete runs at that point (over the validation graphs); a tie goes to the smaller lr. Only complete runs
  count. A winner at the grid's edge is named (`edge:`): the grid is extended past it.
- budget: the oracle's share of updated response tokens (`select/fraction`, mean over its steps) at its chosen lr:
  20-Entropy's batch ratio.
- ratio: ict / random keep ⌈ratio·T⌉ tokens of a response of T tokens (selectors/ranking.py), so the ratio that
  updates `budget` of the tokens depends on the lengths: the grid value r ∈ {0.01, …, 0.99} whose Σ⌈r·T_i⌉ / Σ T_i
  over every response the oracle's runs recorded (samples/step_*.jsonl) is closest to the budget (a tie: the smaller).

Arms the given sweeps do not hold keep the values already in --out (stage 2 adds to stage 1's file); `tuned` is true
once every arm of `--arms` (default: every arm of configs/forks_arm/ with an lr of its own) has a chosen lr.
`--difficulty`: the scan's graphs ranked by the metric, and the 2nd, 5th and 8th of 9 (the tertiles' middles) to tune
on. A bad input is one `error:` line and exit status 2.
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
from tokenrl.report.contrasts import contrast_metric  # noqa: E402
from tokenrl.report.runs import Run, load_sweep  # noqa: E402

ARMS = sorted(  # the arms tuned for themselves (the swaps read another arm's lr)
    p.stem for p in (ROOT / "configs" / "forks_arm").glob("*.yaml") if f"forks_tuned.lr.{p.stem}}}" in p.read_text()
)
UNTUNED = ROOT / "configs" / "forks_tuned" / "untuned.yaml"
LR_KEY = "algorithm.optimizer.lr"


class FlowListDumper(yaml.SafeDumper):
    """Lists on one line (`[a, b]`): the config reference (scripts/config_reference.py) reads list items only under
    `defaults:`."""


FlowListDumper.add_representer(
    list, lambda dumper, value: dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)
)


def choose_lrs(runs: list[Run], metric: str = "pass@1") -> dict[str, dict]:
    """arm → {"lr": chosen, "grid": {lr: [mean metric, n runs]}, "edge": the winner is the grid's end} over the
    complete runs."""
    value_of = contrast_metric(metric)[1]
    table: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        if not run.complete or "forks_arm" not in run.overrides or LR_KEY not in run.overrides:
            continue
        value = value_of(run)
        if not math.isnan(value):
            table.setdefault(run.overrides["forks_arm"], {}).setdefault(float(run.overrides[LR_KEY]), []).append(value)
    chosen = {}
    for arm, grid in table.items():
        means = {lr: sum(v) / len(v) for lr, v in grid.items()}
        best = min(means, key=lambda lr: (-means[lr], lr))
        edge = len(grid) > 1 and best in (min(grid), max(grid))
        table_of_arm = {lr: [round(means[lr], 6), len(grid[lr])] for lr in sorted(grid)}
        chosen[arm] = {"lr": best, "grid": table_of_arm, "edge": edge}
    return chosen


def difficulty(runs: list[Run], metric: str) -> tuple[list[tuple[int, float]], list[int]]:
    """The scan's graphs (seed, metric) from hardest to easiest, and the three to tune on: with n graphs, ranks
    ⌊n/6⌋, ⌊n/2⌋ and ⌊5n/6⌋ (0-based; the 2nd, 5th and 8th of 9)."""
    value_of = contrast_metric(metric)[1]
    ranked = sorted(((run.seed, value_of(run)) for run in runs if run.complete), key=lambda pair: (pair[1], pair[0]))
    ranked = [(seed, value) for seed, value in ranked if not math.isnan(value)]
    if len(ranked) < 3:
        raise ValueError(f"the scan has {len(ranked)} complete runs with {metric}: at least 3 are needed")
    n = len(ranked)
    return ranked, [ranked[i][0] for i in (n // 6, n // 2, 5 * n // 6)]


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
    parser.add_argument("folders", type=Path, nargs="+", help="the tuning stage's multirun folders")
    parser.add_argument("--out", type=Path, help="the config to write (configs/forks_tuned/tuned.yaml)")
    parser.add_argument("--metric", default="pass@1", help="what the lr maximises (report/contrasts.py's names)")
    parser.add_argument("--arms", nargs="+", default=ARMS, help="the arms that must be tuned")
    parser.add_argument("--difficulty", action="store_true", help="rank a scan's graphs and pick three")
    args = parser.parse_args()
    if args.difficulty:
        try:
            ranked, picked = difficulty([run for folder in args.folders for run in load_sweep(folder)], args.metric)
        except (FileNotFoundError, ValueError) as err:
            parser.exit(2, f"error: {err}\n")
        print("\n".join(f"seed {seed}: {args.metric} {value:.4f}" for seed, value in ranked))
        print(f"tune on: seed={','.join(map(str, picked))}")
        return
    if args.out is None:
        parser.exit(2, "error: --out is required (the config to write), except with --difficulty\n")
    try:
        runs = [run for folder in args.folders for run in load_sweep(folder)]
        chosen = choose_lrs(runs, args.metric)
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
        edges = sorted(
            {*(base.get("edge") or []), *(arm for arm, entry in chosen.items() if entry["edge"])}
            - {arm for arm, entry in chosen.items() if not entry["edge"]}
        )
        config = {
            "tuned": set(done) >= set(args.arms) and not edges,
            "metric": args.metric,
            "source": sorted(set(base.get("source") or []) | set(sources)),
            "budget": round(budget, 4),
            "ratio": ratio,
            "responses": responses,
            "lr": lrs,
            "chosen_arms": done,
            "edge": edges,
            "grid": grids,
        }
    except (FileNotFoundError, ValueError, KeyError) as err:
        parser.exit(2, f"error: {err}\n")
    header = (
        "# Written by scripts/forks_choose.py from the tuning sweeps on validation graphs (`source`); do not edit.\n"
        f"#   python scripts/forks_choose.py {' '.join(config['source'])} --metric {args.metric} "
        f"--arms {' '.join(args.arms)} --out {args.out}\n"
        f"# lr: per arm, the grid point with the highest {args.metric} (grid: lr → [mean, runs]); budget: the\n"
        "# oracle's share of updated tokens; ratio: ict's / random's ⌈ratio·T⌉ that matches it over `responses`.\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        header + yaml.dump(config, Dumper=FlowListDumper, sort_keys=False, allow_unicode=True, width=1000)
    )
    missing = sorted(set(args.arms) - set(done))
    print(
        f"{args.out}: lr {', '.join(f'{a} {lrs[a]:g}' for a in done)}; budget {config['budget']}, ratio {ratio}"
        + (f"; still untuned: {', '.join(missing)}" if missing else "; every arm tuned")
        + (f"; edge: {', '.join(edges)} won at the grid's end: extend the grid past it" if edges else "")
    )


if __name__ == "__main__":
    main()
