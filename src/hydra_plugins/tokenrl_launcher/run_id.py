"""`${tokenrl.run_id:}`: the name of a run or sweep folder, unique whatever the clock says.

`<time>_<pid>-<4 hex>` (`2026-11-27_14-03-22_48213-9f3a`): the readable start time, then this process's id (two runs
alive on one machine never share it) and 16 random bits (runs on other machines writing to the same disk). Two runs
started in the same second get two folders, so their CSV loggers never share a file.

Registered with `use_cache=True`, as Hydra's `${now:}` is: a config resolves it once, and Hydra copies that value into
each sweep job's config (`load_sweep_config`), also into a job the fresh-process or SLURM launcher unpickles, so a
sweep's jobs share one folder, and a requeued SLURM job finds its own. Hydra imports every module under
`hydra_plugins` before it composes a config (its plugin scan), so importing this package registers the resolver in
`train.py`, `eval.py`, the compose API and every launcher's job process.
"""

from __future__ import annotations

import os
import secrets
import time

from omegaconf import OmegaConf

RESOLVER = "tokenrl.run_id"
TIME_FORMAT = "%Y-%m-%d_%H-%M-%S"


def run_id() -> str:
    """`<time>_<pid>-<4 hex>`, a new one at each call."""
    return f"{time.strftime(TIME_FORMAT, time.localtime(time.time()))}_{os.getpid()}-{secrets.token_hex(2)}"


def register() -> None:
    """Make `${tokenrl.run_id:}` resolvable (again: Hydra's plugin scan may execute this package twice)."""
    OmegaConf.register_new_resolver(RESOLVER, run_id, use_cache=True, replace=True)
