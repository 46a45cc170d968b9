"""`tokenrl-export SOURCE OUT` (`python -m tokenrl.cli.export`): a training checkpoint (a run folder, a .ckpt file or a
sharded checkpoint's folder) as the plain Hugging Face model folder every run writes to `<run>/model/`, its architecture
and tokenizer rebuilt from the run's saved config (docs/export.md).

    tokenrl-export logs/train/runs/<time> out/ [--dtype bf16|fp32|fp16] [--adapter-only] [--config YAML]
                   [--overwrite] [--push-to-hub USER/NAME [--private]]
"""

from __future__ import annotations

import argparse
import logging
import sys

from tokenrl.cli.errors import OneLineParser
from tokenrl.models import DTYPES
from tokenrl.run.trained_policy import EXPORT_ERRORS, ExportOptions, export


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="tokenrl-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "source", help="a run folder (its checkpoints/last.ckpt), a .ckpt file or a sharded checkpoint's folder"
    )
    parser.add_argument("out", help="the Hugging Face folder to write")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        help="the weights' dtype (default: the run's export.dtype; unset, bf16 for GPU runs, else the model's dtype)",
    )
    parser.add_argument("--adapter-only", action="store_true", help="a LoRA run's adapter alone (peft), not merged")
    parser.add_argument(
        "--config", help="the run's .hydra/config.yaml (default: the one of the run folder that holds the checkpoint)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it exists and is not empty")
    parser.add_argument("--push-to-hub", metavar="REPO", help="then upload OUT to this Hub model repository")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options = ExportOptions(args.dtype, args.adapter_only, args.config, args.overwrite, args.push_to_hub, args.private)
    try:
        export(args.source, args.out, options)
    except EXPORT_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
