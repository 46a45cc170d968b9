"""A sweep of one job that writes its pid and sleeps, run by the fresh-process launcher: the sweep that
tests/hydra_plugins/test_fresh_process_launcher.py kills.

    python -m tests.helpers.sleepy_sweep -m +pid_file=<path>
"""

import os
import time
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

STORE = ConfigStore.instance()
STORE.store(
    group="hydra/launcher",
    name="fresh_process",
    node={
        "_target_": "hydra_plugins.tokenrl_launcher.fresh_process.FreshProcessLauncher",
        "n_jobs": 1,
        "gpus_per_job": 0,
    },
)
STORE.store(name="sleepy", node={"defaults": [{"override hydra/launcher": "fresh_process"}, "_self_"]})


@hydra.main(version_base="1.3", config_path=None, config_name="sleepy")
def main(cfg: DictConfig) -> None:
    Path(cfg.pid_file).write_text(str(os.getpid()))
    time.sleep(600)


if __name__ == "__main__":
    main()
