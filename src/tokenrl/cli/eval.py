"""`python eval.py [overrides]` (also the `tokenrl-eval` console script): pass@k of a model (optionally a training
checkpoint) on benchmarks (run/trained_policy.py); what it writes under the run folder: evaluation/runner.py."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from tokenrl.cli.errors import report_user_error
from tokenrl.config.command_line import composition_problem
from tokenrl.paths import CONFIG_DIR
from tokenrl.run.allocator import reexec_with_tcmalloc
from tokenrl.run.trained_policy import EVAL_ERRORS, evaluate_model


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def evaluate_main(cfg: DictConfig) -> None:
    try:
        evaluate_model(cfg)
    except EVAL_ERRORS as err:
        report_user_error(err)
        raise SystemExit(2) from None


def main() -> None:
    reexec_with_tcmalloc()
    problem = composition_problem(sys.argv[1:], "eval")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    evaluate_main()


if __name__ == "__main__":
    main()
