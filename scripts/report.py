"""Report over a Hydra multirun folder: tables (mean ± 95% CI over seeds, paired Δ vs a baseline), plots, samples.

    python scripts/report.py logs/cpu_study/multiruns/<time> --out reports/cpu_study [--baseline uniform]
        [--also-against random] [--title "CPU selector study"] [--reading notes.md]

Writes report.md, report.json, curves.png, passk.png and samples.html into --out (default: <folder>/report).
Failed, incomplete and never-started runs are listed as such and left out of every mean. A bad input (a missing or
empty folder, a single run's folder) is one `error:` line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tokenrl.cli.errors import OneLineParser  # noqa: E402
from tokenrl.report import build_report  # noqa: E402


def main() -> None:
    parser = OneLineParser(prog="python scripts/report.py", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a multirun folder (logs/<task_name>/multiruns/<time>)")
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
    args = parser.parse_args()
    try:
        if args.reading and not args.reading.is_file():
            raise FileNotFoundError(f"--reading {args.reading}: no such file")
        payload = build_report(
            args.folder,
            args.out or args.folder / "report",
            args.baseline,
            args.title,
            args.reading,
            tuple(args.also_against),
        )
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    bad = [r for r in payload["runs"] if r["status"] != "complete"]
    print(
        f"{len(payload['runs']) - len(bad)} complete runs, {len(bad)} not complete, "
        f"{len(payload['missing'])} never started -> {args.out or args.folder / 'report'}/report.md"
    )


if __name__ == "__main__":
    main()
