"""Rollout samples with per-token statistics and token choices, for the report's "branching tokens" view.

On the first rollout step and every `every_n_steps`-th after it, the first `rows` responses of the batch (the first
group(s), so the rollouts of one prompt sit side by side) go to `<run>/samples/step_NNNN.jsonl`, NNNN the step counted
from 1 as the console and metrics.csv count it (`step_0001.jsonl` is the first step), one JSON object per response:
the decoded prompt and token pieces, reward, advantage, per-token entropy (and JS when computed), the mask this
run's selector actually updated (`updated`), and what each reference selector would choose on the same tokens
(`would_select`: `selectors.reference_selectors`, ICT top-10% per response without warm-up when JS is there,
20-Entropy, STAPO; a reference named like the run's own selector but at another ratio is named with its ratio,
`ict@0.1`), and the true forks (`forks`, 0/1 per token) where the task names them (task=forks).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors import reference_selectors
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import UpdateResult


def _rounded(values: torch.Tensor) -> list[float | None]:
    """Rounded values; a non-finite one (KL-Cov's unbounded ε) as null, so the file stays standard JSON."""
    return [round(float(v), 5) if torch.isfinite(v) else None for v in values]


class SampleWriter:
    """Writes the first `rows` responses of the first and every `every_n_steps`-th rollout step after it (0 turns it
    off)."""

    def __init__(
        self,
        folder: Path,
        every_n_steps: int,
        rows: int,
        tokenizer: PreTrainedTokenizerBase,
        selector_name: str,
        selector_ratio: float | None = None,
    ) -> None:
        if every_n_steps < 0 or rows < 0:
            raise ValueError(f"samples.every_n_steps={every_n_steps} and samples.rows={rows} must be >= 0")
        self.folder, self.every, self.rows = Path(folder), every_n_steps, rows
        self.tokenizer, self.selector_name, self.selector_ratio = tokenizer, selector_name, selector_ratio

    def due(self, step: int) -> bool:
        """Whether the rollout step of 0-based index `step` is written."""
        return self.every > 0 and self.rows > 0 and step % self.every == 0

    @staticmethod
    def reference_masks(batch: SelectionBatch) -> dict[str, torch.Tensor]:
        """What each reference selector would update in `batch`. Call it on every rank: a `global` scope
        gathers across ranks, so a rank-0-only call would wait forever under DDP."""
        return {
            name: selector.select(batch).mask
            for name, selector in reference_selectors(batch.stats.js is not None).items()
        }

    def reference_name(self, name: str, ratio: float | None) -> str:
        """`name`, or `name@ratio` when the run's own selector has that name at another ratio (ICT at 0.3 beside the
        reference ICT at the paper's 0.1)."""
        differs = name == self.selector_name and ratio is not None and ratio != self.selector_ratio
        return f"{name}@{ratio:g}" if differs else name

    def record(self, train: TrainBatch, update: UpdateResult, whole: SelectionBatch, rank: int) -> None:
        """The step's rows, when a page is due: every rank computes the reference selections (they may gather across
        ranks), rank 0 writes."""
        if not self.due(train.step):
            return
        references = reference_selectors(whole.stats.js is not None)
        would = {
            self.reference_name(name, getattr(references[name], "ratio", None)): mask
            for name, mask in self.reference_masks(whole).items()
        }
        if rank == 0:
            self.write(
                train.step + 1,
                train.rollouts,
                train.rewards,
                whole,
                update.first_epoch_weights,
                would,
                update.first_epoch_shaping,
                None if train.forks is None else train.forks.forks,
            )

    def write(
        self,
        step: int,
        rollouts: RolloutBatch,
        rewards: torch.Tensor,
        batch: SelectionBatch,
        updated: torch.Tensor,
        would: dict[str, torch.Tensor],
        shaping: dict[str, torch.Tensor] | None = None,
        forks: torch.Tensor | None = None,
    ) -> Path:
        """One JSONL file for rollout step `step` (counted from 1); `batch` is the selector's view of the whole rollout
        batch, `updated` the run's token weights (0/1 for a mask), `would` its `reference_masks`, `shaping` the
        per-token fields the run's selections set (per-token ε_high, KL weights, advantages, drift penalty)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step_{step:04d}.jsonl"
        prompt_texts = self.tokenizer.batch_decode(rollouts.prompt_ids[: self.rows], skip_special_tokens=True)
        with path.open("w") as handle:
            for row in range(min(self.rows, len(rollouts.texts))):
                length = int(rollouts.response_mask[row].sum())
                ids = rollouts.response_ids[row, :length].tolist()
                record = {
                    "step": step,
                    "row": row,
                    "group": int(rollouts.group_ids[row]),
                    "selector": self.selector_name,
                    "prompt": prompt_texts[row],
                    "tokens": [self.tokenizer.decode([token]) for token in ids],
                    "reward": float(rewards[row]),
                    "advantage": round(float(batch.advantages[row]), 5),
                    "finish_reason": rollouts.finish_reasons[row],
                    "entropy": _rounded(batch.stats.entropy[row, :length]),
                    "js": None if batch.stats.js is None else _rounded(batch.stats.js[row, :length]),
                    "updated": _weights(updated[row, :length]),
                    "shaping": {name: _rounded(values[row, :length]) for name, values in (shaping or {}).items()},
                    "would_select": {name: [int(v) for v in mask[row, :length]] for name, mask in would.items()},
                    "forks": None if forks is None else [int(v) for v in forks[row, :length]],
                }
                handle.write(json.dumps(record) + "\n")
        return path


def _weights(values: torch.Tensor) -> list[float]:
    """Token weights as written: ints for a 0/1 mask, else rounded floats."""
    return [int(v) if float(v).is_integer() else round(float(v), 4) for v in values]
