"""`python train.py [overrides]` (also the `tokenrl-train` console script): complete the command line for the
machine (`config/command_line.py`), check its settings before Hydra makes the run folder (a refused run leaves none),
let Hydra compose the config, and run it (`run/training.py`). The training stack is imported only once Hydra has a
config to run, so `--help` and `--cfg job` answer without loading it."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tokenrl.cli.errors import report_user_error
from tokenrl.config.command_line import check_settings, composition_problem, run_dir_override, with_machine_defaults
from tokenrl.paths import CONFIG_DIR
from tokenrl.run.allocator import reexec_with_tcmalloc


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def train(cfg: DictConfig) -> float | None:
    from tokenrl.run.training import USER_ERRORS, run

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    try:
        summary = run(cfg, overrides)
    except USER_ERRORS as err:
        report_user_error(err)
        raise SystemExit(2) from None
    return summary.get(cfg.get("optimized_metric") or "", None)


def main() -> None:
    reexec_with_tcmalloc()
    sys.argv[1:] = with_machine_defaults(run_dir_override(sys.argv[1:]))
    problem = composition_problem(sys.argv[1:])
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    try:
        check_settings(sys.argv[1:])
    except ValueError as err:  # ConfigError
        report_user_error(err)
        raise SystemExit(2) from None
    train()


if __name__ == "__main__":
    main()
