"""One rollout step of every given method under the real Trainer, on one process or WORLD Lightning DDP ranks (gloo,
CPU), for tests/step/test_invariance.py's two-ranks test. All methods run in one launch (one process group, one fit
each).

Settings: the tiny model, each method's preset with tests/helpers/varied.py's `ACTS`, 4 prompts × G 8, micro-batches
of 3 rows, two PPO epochs of one mini-batch (the split of rows into mini-batches does not depend on the rank count: a
mini-batch is every rank's rows; the second epoch sees a moved policy), SGD at lr 1 so that the ratio moves without
Adam amplifying float rounding, float32. Each prompt is sampled alone with a seed from its tokens (as
tests/helpers/ddp_step.py's `PerPromptEngine`), so every rank count sees the same rollouts (and the same engine
disagreement, tests/helpers/varied.py: `DisagreeingEngine`), and rank r holds the r-th contiguous slice of the prompts
(data/datamodule.py: `rank_shard`), so the global row ids agree too.

`--per-rank N M1,M2`: on one process, the selectors of methods M1, M2… choose on each of N contiguous slices of the
rows by itself (what the selector of each of N ranks sees, `PerRankSelector`) — the one-process counterpart of the
methods whose selection scope is this rank's mini-batch.

    python tests/helpers/ddp_methods.py OUT_DIR WORLD [--per-rank N M1,M2] METHOD [METHOD ...]

Writes OUT_DIR/<method>[.per_rank]/rank<r>.pt per rank: the policy weights before and after the step, the first
epoch's token weights and shaping fields of this rank's rows, and the rank's global row ids.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.conftest import TINY, compose_config  # noqa: E402  (run as a script: after the sys.path set-up)
from tests.helpers.ddp_step import full_weights  # noqa: E402
from tests.helpers.varied import ACTS, DisagreeingEngine, InProcessScorer  # noqa: E402
from tokenrl.records.selection import Selection, SelectionBatch, single_process  # noqa: E402
from tokenrl.run.training import build_components  # noqa: E402

SETTING = TINY + [
    "samples.every_n_steps=0",
    "task.verifier=tests.helpers.varied:share_reward",
    "task.train_size=64",
    "task.test_size=8",
    "total_steps=1",
    "selector_warmup_steps=0",
    "algorithm.kl_coef=0.01",
    "algorithm.micro_batch_size=3",
    "algorithm.optimizer._target_=torch.optim.SGD",
    "~algorithm.optimizer.betas",
    "~algorithm.optimizer.weight_decay",
    "algorithm.optimizer.lr=1.0",
    "trainer.precision=32-true",
]
REGIME = ["algorithm.ppo_epochs=2", "algorithm.mini_batches=1"]
FIELDS = ("clip_low", "clip_high", "kl_weights", "advantages", "drift_coef")


class PerRankSelector:
    """`inner`, choosing on each contiguous slice of `rows_per_rank` global rows by itself: what the selector of each
    rank sees under DDP when its scope is the rank's mini-batch. Everything else is `inner`'s."""

    def __init__(self, inner, rows_per_rank: int) -> None:
        self.inner, self.rows_per_rank = inner, rows_per_rank

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def select(self, batch: SelectionBatch) -> Selection:
        slices = batch.row_ids // self.rows_per_rank
        parts = []
        for rank in torch.unique(slices).tolist():
            rows = (slices == rank).nonzero().squeeze(1)
            parts.append(
                (
                    rows,
                    self.inner.select(
                        SelectionBatch(
                            batch.stats.rows(rows),
                            batch.advantages[rows],
                            batch.response_mask[rows],
                            batch.group_ids[rows],
                            batch.row_ids[rows],
                            batch.step,
                            single_process,
                            0,
                        )
                    ),
                )
            )
        weights = torch.zeros(batch.response_mask.shape)
        fields = {}
        for rows, selection in parts:
            weights[rows] = selection.weights
            for name in FIELDS:
                value = getattr(selection, name)
                if value is not None:
                    fields.setdefault(name, torch.zeros(weights.shape, dtype=value.dtype))[rows] = value
        return Selection(weights, parts[0][1].normalizer, **fields)


class Capture(L.Callback):
    """Swaps in the per-prompt engine; records the weights before the step and this rank's
    first-epoch selection and row ids."""

    def on_train_start(self, trainer, module) -> None:
        module.engine = DisagreeingEngine(module.policy, module.tokenizer)
        module.engine.per_prompt = True
        self.initial = full_weights(module.policy)
        update = module.update_step

        def spy(train, timer):
            lr, result = update(train, timer)
            self.rows = torch.arange(train.size) + train.row_offset
            self.selection = {"weights": result.first_epoch_weights, **result.first_epoch_shaping}
            return lr, result

        module.update_step = spy


def one_step(out: Path, world: int, method: str, per_rank: int) -> None:
    trainer = ["trainer=cpu"] if world == 1 else ["trainer=ddp", "trainer.accelerator=cpu", f"trainer.devices={world}"]
    cfg = compose_config(
        SETTING + [f"method={method}", *ACTS.get(method, [])] + REGIME + trainer + [f"paths.output_dir={out}"]
    )
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    module.collector.scorer = InProcessScorer()
    if per_rank:
        rows = cfg.algorithm.prompts_per_step * cfg.algorithm.group_size // per_rank
        module.selector = PerRankSelector(module.selector, rows)
    capture = Capture()
    trainer.callbacks.append(capture)
    trainer.fit(module, datamodule=datamodule)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "initial": capture.initial,
            "weights": full_weights(module.policy),
            "rows": capture.rows,
            "selection": capture.selection,
            "optimizer_steps": module.run_state.optimizer_steps,
        },
        out / f"rank{trainer.global_rank}.pt",
    )


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)  # as Lightning sets each DDP rank (a second thread only waits on a busy machine)
    out, world, rest = Path(argv[0]), int(argv[1]), argv[2:]
    per_rank, local = 0, set()
    if rest[:1] == ["--per-rank"]:
        per_rank, local, rest = int(rest[1]), set(rest[2].split(",")), rest[3:]
    for method in rest:
        one_step(out / method, world, method, 0)
        if method in local:
            one_step(out / f"{method}.per_rank", world, method, per_rank)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
