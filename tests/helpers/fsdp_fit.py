"""Fit the tiny model under FSDP over 2 gloo CPU ranks (the fsdp preset: sharded checkpoints, or full with
`trainer.strategy.state_dict_type=full`) and write rank 0's reward history, rollout step and the policy's full weights
at the end to OUT_DIR/result.pt (tests/step/test_distributed.py: resume under FSDP). With `--snapshot`, after rollout
step 1 the run also writes a checkpoint of each kind, OUT_DIR/step1/sharded (a folder) and OUT_DIR/step1/full.ckpt,
through the strategy's own save (as the checkpoint callback does), and the policy's weights at that point to result.pt's
`step1_weights`: one straight run yields both checkpoints to resume from. Runs after `--then` fit one after another on
the same two ranks, each a trainer of its own (both resumes in one launch: two start-ups fewer).

    python tests/helpers/fsdp_fit.py OUT_DIR [CKPT_PATH|-] [--snapshot] [OVERRIDE ...] [--then OUT_DIR CKPT_PATH ...]
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
from tokenrl.run.training import build_components  # noqa: E402

SNAPSHOTS = {"sharded": Path("step1") / "sharded", "full": Path("step1") / "full.ckpt"}


class SnapshotAfterStep1(L.Callback):
    """After rollout step 1: a checkpoint in each `state_dict_type` and the gathered policy (every rank takes part)."""

    def __init__(self, out: Path) -> None:
        self.out, self.weights = out, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if module.run_state.rollout_step != 1:
            return
        kept = trainer.strategy._state_dict_type
        for kind, path in SNAPSHOTS.items():
            trainer.strategy._state_dict_type = kind
            trainer.save_checkpoint(self.out / path)
        trainer.strategy._state_dict_type = kept
        self.weights = full_weights(module.policy)


def fit(out: Path, ckpt: str, overrides: list[str]) -> None:
    """One run: fit (from `ckpt` unless "-"), then rank 0 writes OUT_DIR/result.pt."""
    snapshot = SnapshotAfterStep1(out) if "--snapshot" in overrides else None
    cfg = compose_config(
        OVERRIDES
        + [
            "trainer=fsdp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            f"trainer.strategy._target_=tests.helpers.ddp_step.{CPUFSDPStrategy.__name__}",
            "checkpoint.enabled=true",
            "checkpoint.every_n_steps=1",
            "trainer.strategy.mixed_precision.param_dtype=null",
            # an optimizer with state: Lightning's FSDP load indexes the first state entry
            "algorithm.optimizer._target_=torch.optim.AdamW",
            "algorithm.optimizer.lr=1e-3",
            f"paths.output_dir={out}",
            *(o for o in overrides if o != "--snapshot"),
        ]
    )
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    if snapshot:
        trainer.callbacks.append(snapshot)
    trainer.fit(module, datamodule=datamodule, ckpt_path=None if ckpt == "-" else ckpt)
    weights = full_weights(module.policy)  # gathered: every rank takes part
    if trainer.is_global_zero:
        torch.save(
            {
                "reward_history": module.run_state.reward_history,
                "rollout_step": module.run_state.rollout_step,
                "weights": weights,
                "step1_weights": snapshot and snapshot.weights,
            },
            out / "result.pt",
        )
    torch.distributed.barrier()


if __name__ == "__main__":
    runs, run = [], []
    for arg in sys.argv[1:] + ["--then"]:
        if arg == "--then":
            runs.append(run)
            run = []
        else:
            run.append(arg)
    for out, ckpt, *overrides in runs:
        fit(Path(out), ckpt, overrides)
    torch.distributed.destroy_process_group()
