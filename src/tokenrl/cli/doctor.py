"""`tokenrl-doctor` (`python -m tokenrl.cli.doctor`): whether this machine runs tokenrl, in a few minutes.

It reports the versions (Python, torch and its CUDA, the NVIDIA driver, vLLM and the model runner it will use,
transformers, Lightning), the devices and their memory, the memory plan of the default run on the first device, and
then runs two rollout steps of the tiny model on each engine and strategy the machine can run — `hf` on one device,
`vllm` on one device (when installed), DDP over the available devices (two CPU processes without GPUs) — each in a
fresh `python train.py` process, fp32 on both sides. A check passes when the run ends, its loss is finite, every
weight in its last.ckpt is finite (so were the gradients), and the engine follows the weights: after the first
update the engine's log-probs of its samples agree with the trainer's (`train/logprob_gap_max` ≤ 1e-3). It prints a
table, writes a JSON to attach to a bug report, and exits with 1 when a check fails. The report goes to a folder of its
own, `logs/doctor/<time>_<pid>-<4 hex>/doctor.json` (as a run's folder is named), or to `--out`; the last line says
where.

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
