"""One rollout step of the real module under Lightning on CPU processes: `strategy` ddp or fsdp over `world` gloo
ranks, or one process. Each prompt's rollouts are sampled on their own with a seed from the prompt's tokens, so every
rank count sees the same rollouts for the same prompt. Writes OUT_DIR/result.pt from rank 0: the full policy weights
before and after the step (gathered from the shards under FSDP), per rank the number of backward passes that
all-reduced gradients (DDP) and of optimizer steps, the global gradient norm seen by each optimizer step and the keys
of the module's state dict.

    python tests/helpers/ddp_step.py OUT_DIR WORLD [ddp|fsdp] [OVERRIDE ...]

DDP_STEP_ACCELERATOR=gpu runs the ranks on GPUs (NCCL) instead of CPU processes (gloo).
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.conftest import compose_config  # noqa: E402
from tokenrl.records.rollout_batch import concat_rollouts  # noqa: E402
from tokenrl.rollout.hf import HFEngine  # noqa: E402
from tokenrl.run.checkpointing import AtomicFSDPStrategy  # noqa: E402
from tokenrl.run.training import build_components  # noqa: E402

OVERRIDES = [
    "model=tiny",
    "logger=none",
    "checkpoint.enabled=false",
    "validation.every_n_steps=0",
    "samples.every_n_steps=0",
    "trainer.enable_progress_bar=false",
    "rollout.max_new_tokens=10",
    "task.verifier=tests.helpers.rewards:length_reward",
    "total_steps=1",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.micro_batch_size=2",
    "algorithm.ppo_epochs=2",
    "selector=ict",
    "selector.scope=global",
    "selector_warmup_steps=0",
    "algorithm.optimizer._target_=torch.optim.SGD",
    "~algorithm.optimizer.betas",
    "~algorithm.optimizer.weight_decay",
    "algorithm.optimizer.lr=1.0",
    "trainer.precision=32-true",
]


def _full_state_dict_on_cpu(module, world_size, rank0_only=True):
    """Lightning's full-state-dict context without `offload_to_cpu`: on a CPU device torch's offload aliases the
    unsharded buffer that it frees on leaving the context, and Lightning's checkpoint then clones freed memory (a
    segfault). A CPU-only artefact of these tests: on GPUs the offload is a real copy."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.state_dict_type(
        module,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
        FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
    )


class CPUFSDPStrategy(AtomicFSDPStrategy):
    """The fsdp preset's strategy (a subclass of Lightning's FSDPStrategy, which Lightning refuses with a CPU
    accelerator by an exact-type check in `_AcceleratorConnector._check_strategy_and_fallback` although torch's FSDP
    runs on CPU over gloo) whose full checkpoints gather without offloading (`_full_state_dict_on_cpu`)."""

    def setup_environment(self) -> None:
        import lightning.pytorch.strategies.fsdp as lightning_fsdp

        lightning_fsdp._get_full_state_dict_context = _full_state_dict_on_cpu
        super().setup_environment()


class PerPromptEngine(HFEngine):
    """Samples each prompt alone, seeded by its token ids: rollouts do not depend on how prompts are split."""

    def _generate(self, prompt_ids, params, seed):
        parts = [
            super(PerPromptEngine, self)._generate([ids], params, zlib.crc32(str(ids).encode())) for ids in prompt_ids
        ]
        return concat_rollouts(parts, self.tokenizer.pad_token_id)


def full_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's full state dict on the host (under FSDP gathered on every rank: all ranks must call it)."""
    return {name: tensor.detach().cpu().clone() for name, tensor in policy.state_dict().items()}


class Probe(L.Callback):
    """Swaps in the per-prompt engine, counts backward passes that all-reduce (bucket 0 of each), records the
    global gradient norm each optimizer step applies (after clipping; FSDP: summed over the ranks' shards) and, per
    step, whether this rank's own rows could take the statistics from the update's forward and whether it did."""

    def __init__(self) -> None:
        self.synced_backwards = 0
        self.grad_norms: list[float] = []
        self.paths: list[tuple[bool, bool]] = []

    def on_train_start(self, trainer, module) -> None:
        module.engine = PerPromptEngine(module.policy, module.tokenizer)
        self.initial = full_weights(module.policy)
        update = module.update_step

        def recorded(train, timer):
            alone = module.passes.plan.statistics_blocker(module.cfg, module.selector, train.rollouts)
            lr, result = update(train, timer)
            self.paths.append((alone is None, result.fused_statistics))
            return lr, result

        module.update_step = recorded
        if isinstance(trainer.strategy.model, torch.nn.parallel.DistributedDataParallel):

            def counting(state, bucket):
                self.synced_backwards += int(bucket.index() == 0)
                return allreduce_hook(state, bucket)

            trainer.strategy.model.register_comm_hook(None, counting)

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        square = sum(p.grad.double().pow(2).sum() for p in module.policy.parameters() if p.grad is not None)
        if isinstance(trainer.strategy, FSDPStrategy):
            torch.distributed.all_reduce(square)
        self.grad_norms.append(float(square.sqrt()))


def one_step(out: Path, overrides: list[str]) -> dict | None:
    """Fit one rollout step with `overrides` (the trainer's among them); returns rank 0's result (None on the other
    ranks) and writes it to OUT/result.pt."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = compose_config(OVERRIDES + overrides + [f"paths.output_dir={out}"])
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    probe = Probe()
    trainer.callbacks.append(probe)
    trainer.fit(module, datamodule=datamodule)
    counts = torch.tensor([probe.synced_backwards, module.run_state.optimizer_steps], device=module.device)
    paths = torch.tensor(probe.paths[0], device=module.device)  # the first step's (alone could fuse, fused)
    weights = full_weights(module.policy)
    checkpoint_keys = list(module.state_dict())  # what a checkpoint's state_dict holds (FSDP: gathered, collective)
    if torch.distributed.is_initialized():
        everyone = [torch.zeros_like(counts) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(everyone, counts)
        counts = torch.stack(everyone)
        every_path = [torch.zeros_like(paths) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(every_path, paths)
        paths = torch.stack(every_path)
        torch.distributed.destroy_process_group()
    if not trainer.is_global_zero:
        return None
    result = {
        "weights": weights,
        "initial": probe.initial,
        "counts": counts.cpu().reshape(-1, 2),
        "paths": paths.cpu().reshape(-1, 2).bool(),
        "grad_norms": probe.grad_norms,
        "checkpoint_keys": checkpoint_keys,
    }
    torch.save(result, out / "result.pt")
    return result


def main(out: Path, world: int, strategy: str, overrides: list[str]) -> None:
    accelerator = os.environ.get("DDP_STEP_ACCELERATOR", "cpu")  # gpu: the same check over NCCL (gpu_check.sh)
    trainer = (
        [f"trainer={'cpu' if accelerator == 'cpu' else 'gpu'}"]
        if world == 1
        else [f"trainer={strategy}", f"trainer.accelerator={accelerator}", f"trainer.devices={world}"]
    )
    if strategy == "fsdp" and world > 1:
        trainer.append(f"trainer.strategy._target_={__name__}.{CPUFSDPStrategy.__name__}")
    one_step(out, trainer + overrides)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "ddp", sys.argv[4:])
