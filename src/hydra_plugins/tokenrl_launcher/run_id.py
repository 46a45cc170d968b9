"""`${tokenrl.run_id:}`: a run or sweep folder's name, `<time>_<pid>-<4 hex>` (`2026-11-27_14-03-22_48213-9f3a`), never
shared by two runs started in the same second: the process id tells runs on one machine apart, 16 random bits runs on
others writing to the same disk. Cached as Hydra's `${now:}` is (`use_cache`): Hydra copies the value into each sweep
job's config, so a sweep's jobs share one folder and a requeued SLURM job finds its own.
"""

from __future__ import annotations

import os
import secrets
import time

RESOLVER = "tokenrl.run_id"
TIME_FORMAT = "%Y-%m-%d_%H-%M-%S"


def run_id() -> str:
    """`<time>_<pid>-<4 hex>`, a new one at each call."""
    return f"{time.strftime(TIME_FORMAT, time.localtime(time.time()))}_{os.getpid()}-{secrets.token_hex(2)}"
