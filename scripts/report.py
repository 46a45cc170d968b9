"""Report over a Hydra multirun folder: tables (mean ± 95% CI over seeds, paired Δ vs a baseline), plots, samples.

    python scripts/report.py logs/cpu_study/multiruns/<time> --out reports/cpu_study [--baseline uniform]
        [--also-against random] [--title "CPU selector study"] [--reading notes.md]
        [--contrasts oracle-matched_random ict-random --primary pass@1 --secondary pass@4 reward_auc]
    python scripts/report.py logs/train/runs/<time> --samples [STEP]    # one run's samples: <run>/report/samples.html

Writes report.md, report.json, curves.png, passk.png and samples.html into --out (default: <folder>/report).
Pre-registered contrasts (a paired t-test per `arm_a-arm_b` over the seeds both completed, Holm over the primary
metric's family, the secondary metrics a second family, the primary family's power) come from the sweep config's
`report:` block, or from --contrasts, which replaces it (docs/sweeps.md). Failed, incomplete and never-started runs
are listed as such and left out of every mean. A bad input (a missing or empty folder, a single run's folder, an
unknown contrast metric) is one `error:` line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tokenrl.cli.errors import OneLineParser  # noqa: E402
from tokenrl.report import build_report  # noqa: E402
from tokenrl.report.html import write_run_samples_page  # noqa: E402
from tokenrl.report.runs import load_run  # noqa: E402


def run_samples(folder: Path, out: Path, step: int | None) -> Path:
    """samples.html in `out` of the run at `folder`: every step it recorded (None), or `step` alone."""
    if not (folder / ".hydra" / "config.yaml").is_file():
        raise ValueError(f"--samples opens a single run's folder (one with .hydra/config.yaml); {folder} is not one")
    return write_run_samples_page(load_run(folder), out / "samples.html", step)


def main() -> None:
    parser = OneLineParser(prog="python scripts/report.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a multirun folder (logs/<task_name>/multiruns/<time>), or a run's with --samples"
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <folder>/report)")
    parser.add_argument("--baseline", default="uniform", help="group the paired differences are taken against")
    parser.add_argument(
        "--also-against",
        nargs="*",
        default=[],
        help="more groups to take paired differences against (e.g. random: the control a selector must beat)",
    )
    parser.add_argument("--title", default=None)
    parser.add_argument("--reading", type=Path, default=None, help="markdown inserted under the command (your reading)")
    parser.add_argument(
        "--contrasts",
        nargs="+",
        default=None,
        help="pre-registered contrasts arm_a-arm_b (replace the sweep config's report.contrasts)",
    )
    parser.add_argument(
        "--primary", default="pass@1", help="the contrasts' primary metric (pass@K, pass@K_auc, reward_auc)"
    )
    parser.add_argument("--secondary", nargs="*", default=[], help="secondary metrics: a separate Holm family")
    parser.add_argument(
        "--samples",
        nargs="?",
        default=False,  # absent; given without STEP: None, every recorded step
        type=int,
        metavar="STEP",
        help="instead of a report: a single run's samples as samples.html, every recorded step or STEP (from 1)",
    )
    args = parser.parse_args()
    try:
        if args.samples is not False:
            print(run_samples(args.folder, args.out or args.folder / "report", args.samples))
            return
        if args.reading and not args.reading.is_file():
            raise FileNotFoundError(f"--reading {args.reading}: no such file")
        payload = build_report(args.folder, args.out or args.folder / "report", args)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    bad = [r for r in payload["runs"] if r["status"] != "complete"]
    print(
        f"{len(payload['runs']) - len(bad)} complete runs, {len(bad)} not complete, "
        f"{len(payload['missing'])} never started -> {args.out or args.folder / 'report'}/report.md"
    )


if __name__ == "__main__":
    main()
