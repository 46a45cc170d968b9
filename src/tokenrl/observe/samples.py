"""Rollout samples with per-token statistics and token choices, for the report's "branching tokens" view.

On the first rollout step and every `every_n_steps`-th after it, the first `rows` responses (the first group(s): one
prompt's rollouts side by side) go to `<run>/samples/step_NNNN.jsonl`, NNNN the step counted from 1 as the console
counts, one JSON object per response: the prompt and token pieces, reward, advantage, per-token entropy and JS, the
run's token weights (`updated`), what each reference selector would choose (`would_select`; `name@ratio` beside a run
selector of that name at another ratio) and the true forks (`forks`, task=forks).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors import reference_selectors
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import UpdateResult


def _rounded(values: torch.Tensor) -> list[float | None]:
    """Rounded values; a non-finite one (KL-Cov's unbounded ε) as null, so the file stays standard JSON."""
    return [round(float(v), 5) if torch.isfinite(v) else None for v in values]


class SampleWriter:
    """Writes the module docstring's files of the run's `selector`; `every_n_steps` or `rows` 0 turns it off."""

    def __init__(
        self, folder: Path, every_n_steps: int, rows: int, tokenizer: PreTrainedTokenizerBase, selector: TokenSelector
    ) -> None:
        if every_n_steps < 0 or rows < 0:
            raise ValueError(f"samples.every_n_steps={every_n_steps} and samples.rows={rows} must be >= 0")
        self.folder, self.every, self.rows = Path(folder), every_n_steps, rows
        self.tokenizer, self.selector_name = tokenizer, selector.name
        self.selector_ratio = getattr(selector, "ratio", None)

    @staticmethod
    def reference_masks(batch: SelectionBatch) -> dict[str, torch.Tensor]:
        """What each reference selector would update in `batch`. Call it on every rank: a `global` scope
        gathers across ranks, so a rank-0-only call would wait forever under DDP."""
        return {
            name: selector.select(batch).mask
            for name, selector in reference_selectors(batch.stats.js is not None).items()
        }

    def record(self, train: TrainBatch, update: UpdateResult, whole: SelectionBatch, rank: int) -> None:
        """The step's file, when one is due: every rank computes the reference selections (they may gather across
        ranks), rank 0 writes. `whole` is the selector's view of the whole rollout batch; `shaping`: per-token ε_high,
        KL weights, advantages, drift penalty."""
        if self.every == 0 or self.rows == 0 or train.step % self.every:
            return
        references = reference_selectors(whole.stats.js is not None)
        would = {}
        for name, mask in self.reference_masks(whole).items():
            ratio = getattr(references[name], "ratio", None)
            # `name@ratio` beside the run's own selector of that name at another ratio (ICT at 0.3 beside ICT at 0.1)
            differs = name == self.selector_name and ratio is not None and ratio != self.selector_ratio
            would[f"{name}@{ratio:g}" if differs else name] = mask
        if rank != 0:
            return
        step = train.step + 1  # counted from 1, as the console counts
        rollouts = train.rollouts
        forks = None if train.forks is None else train.forks.forks
        shaping = update.first_epoch_shaping
        self.folder.mkdir(parents=True, exist_ok=True)
        prompt_texts = self.tokenizer.batch_decode(rollouts.prompt_ids[: self.rows], skip_special_tokens=True)
        with (self.folder / f"step_{step:04d}.jsonl").open("w") as handle:
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
                    "reward": float(train.rewards[row]),
                    "advantage": round(float(whole.advantages[row]), 5),
                    "finish_reason": rollouts.finish_reasons[row],
                    "entropy": _rounded(whole.stats.entropy[row, :length]),
                    "js": None if whole.stats.js is None else _rounded(whole.stats.js[row, :length]),
                    "updated": _weights(update.first_epoch_weights[row, :length]),
                    "shaping": {name: _rounded(values[row, :length]) for name, values in shaping.items()},
                    "would_select": {name: [int(v) for v in mask[row, :length]] for name, mask in would.items()},
                    "forks": None if forks is None else [int(v) for v in forks[row, :length]],
                }
                handle.write(json.dumps(record) + "\n")


def _weights(values: torch.Tensor) -> list[float]:
    """Token weights as written: ints for a 0/1 mask, else rounded floats."""
    return [int(v) if float(v).is_integer() else round(float(v), 4) for v in values]
