"""`python -m tests.helpers.kill_mid_save STEP <train.py overrides>`: train, and SIGKILL this process while it writes
the checkpoint of rollout step STEP (half a file written), as `kill -9` or a node failure during a save would."""

import os
import signal
import sys

import torch

from tokenrl.cli.train import train
from tokenrl.config.command_line import run_dir_override

real_save = torch.save


def killing_save(step: int):
    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("tokenrl", {}).get("rollout_step") == step:
            f.write(b"\0" * 65536)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *args, **kwargs)

    return save


if __name__ == "__main__":  # the reward worker (spawned) imports this module again
    torch.save = killing_save(int(sys.argv.pop(1)))
    sys.argv[1:] = run_dir_override(sys.argv[1:])
    train()
