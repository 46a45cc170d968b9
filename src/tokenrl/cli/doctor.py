"""`tokenrl-doctor` (`python -m tokenrl.cli.doctor`): whether this machine runs tokenrl (docs/running.md). It reports
the versions, the devices and the default run's memory plan, then runs two rollout steps of the tiny model on each
engine and strategy the machine can run (`hf`, `vllm`, DDP): a check passes when loss and weights stay finite and the
engine follows the weights. It prints a table, writes a JSON report (`logs/doctor/<time>_<pid>-<4 hex>/doctor.json`, or
`--out`) and exits with 1 when a check fails.

    tokenrl-doctor [--out PATH] [--only hf vllm ddp] [--extra OVERRIDE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenrl.cli.errors import OneLineParser
from tokenrl.run.machine_check import diagnose, report_path


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="tokenrl-doctor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="the report (JSON); default: logs/doctor/<new folder>/doctor.json")
    parser.add_argument("--only", nargs="+", choices=["hf", "vllm", "ddp"], help="run only these checks")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides added to every check's run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per check")
    args = parser.parse_args(argv)
    if args.out is not None and args.out.is_dir():
        parser.error(f"--out {args.out} is a folder: name the report's file, e.g. --out {args.out / 'doctor.json'}")
    try:
        out = report_path(args.out)  # before the checks: a report that cannot be written is known at once
    except OSError as err:
        parser.error(f"--out {args.out}: cannot create its folder ({err.strerror})")
    return diagnose(out, args.only, args.extra, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
