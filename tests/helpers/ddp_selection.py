"""Run under Lightning DDP (gloo, CPU, 2 processes): each rank selects on its half of a fixed batch with
`scope=global` and counts the loss normaliser; writes what it chose to OUT_DIR/rank<r>.pt.

    python tests/helpers/ddp_selection.py OUT_DIR
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tokenrl.algorithms.config import LossSettings  # noqa: E402
from tokenrl.algorithms.grpo import LossNormalizer  # noqa: E402
from tokenrl.algorithms.logit_statistics import LogitStatistics  # noqa: E402
from tokenrl.records.selection import Selection  # noqa: E402
from tokenrl.selectors import Entropy20Selector, ICTSelector, SelectionBatch  # noqa: E402
from tokenrl.step.distributed import gather_variable, global_loss_normalizer  # noqa: E402

SELECTORS = {
    "ict_global": ICTSelector(ratio=0.1, scope="global", warmup_steps=0),
    "ict_sequence": ICTSelector(ratio=0.1, scope="sequence", warmup_steps=0),
    "entropy20_global": Entropy20Selector(ratio=0.2, scope="global"),
}


def full_batch(seed: int = 0, groups: int = 4, group_size: int = 4, T: int = 12, V: int = 17):
    g = torch.Generator().manual_seed(seed)
    B = groups * group_size
    logits = torch.round(torch.randn(B, T, V, generator=g) * 4) / 2  # quantised: ties across ranks
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    resp = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(0, V, (B, T), generator=g)
    group_ids = torch.arange(groups).repeat_interleave(group_size)
    stats = LogitStatistics(1.0, chunk_size=8).of_logits(logits, ids, resp, group_ids)
    return stats, resp, group_ids, torch.randn(B, generator=g)


def select(rows: torch.Tensor, rank: int, gather) -> dict[str, torch.Tensor]:
    stats, resp, group_ids, adv = full_batch()
    batch = SelectionBatch(
        stats=stats.rows(rows),
        advantages=adv[rows],
        response_mask=resp[rows],
        group_ids=group_ids[rows],
        row_ids=rows,
        step=0,
        gather=gather,
        rank=rank,
    )
    out = {name: selector.select(batch).mask for name, selector in SELECTORS.items()}
    for agg in ("token-mean", "seq-mean-token-mean"):
        settings = LossSettings(agg, 0.2, 0.2)
        norm = global_loss_normalizer(
            LossNormalizer.count(resp[rows], Selection(out["ict_global"], "selected"), settings)
        )
        out[f"normalizer_{agg}"] = torch.tensor([norm.pg, norm.kl])
    return out


class Probe(L.LightningModule):
    def __init__(self, out_dir: Path) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        rank, world = self.global_rank, self.trainer.world_size
        B = full_batch()[1].shape[0]
        rows = torch.arange(rank * B // world, (rank + 1) * B // world)
        torch.save(select(rows, rank, partial(gather_variable, device=self.device)), self.out_dir / f"rank{rank}.pt")
        return self.layer(torch.ones(1, 1)).sum() * 0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Probe(out), DataLoader(list(range(4)), batch_size=1))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # a clean exit: no gloo threads left at interpreter shutdown
