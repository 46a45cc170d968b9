"""Fit the tiny model under FSDP over 2 gloo CPU ranks (the fsdp preset: sharded checkpoints, or full with
`trainer.strategy.state_dict_type=full`) and write rank 0's reward history, rollout step and the policy's full weights
at the end to OUT_DIR/result.pt (tests/test_distributed.py: resume under FSDP).

    python tests/helpers/fsdp_fit.py OUT_DIR [CKPT_PATH|-] [OVERRIDE ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.conftest import compose_config  # noqa: E402
from tests.helpers.ddp_step import OVERRIDES, CPUFSDPStrategy, full_weights  # noqa: E402
from tokenrl.train import build_components  # noqa: E402

if __name__ == "__main__":
    out, ckpt = Path(sys.argv[1]), sys.argv[2]
    cfg = compose_config(OVERRIDES + ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
                                      f"trainer.strategy._target_=tests.helpers.ddp_step.{CPUFSDPStrategy.__name__}",
                                      "checkpoint.enabled=true", "checkpoint.every_n_steps=1",
                                      "trainer.strategy.mixed_precision.param_dtype=null",
                                      # an optimizer with state: Lightning's FSDP load indexes the first state entry
                                      "algorithm.optimizer._target_=torch.optim.AdamW", "algorithm.optimizer.lr=1e-3",
                                      f"paths.output_dir={out}", *sys.argv[3:]])
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    trainer.fit(module, datamodule=datamodule, ckpt_path=None if ckpt == "-" else ckpt)
    weights = full_weights(module.policy)   # gathered: every rank takes part
    if trainer.is_global_zero:
        torch.save({"reward_history": module.reward_history, "rollout_step": module.rollout_step, "weights": weights},
                   out / "result.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
