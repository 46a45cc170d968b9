"""`PromptBatch`: this rank's prompts of one rollout step, as the data module hands them to the collector, and
`rank_shard`, the rule both sides share for which slice of a step's global batch a rank holds."""

from __future__ import annotations

from tokenrl.records.problem import Problem


class PromptBatch:
    """The prompts of rollout step `step`: problems and their tokenised prompts.

    A plain class, not a dataclass: Lightning's precision plugins walk a batch with `apply_to_collection`, which
    rebuilds dataclasses field by field and refuses the frozen `Problem` records inside (trainer=fsdp stopped at its
    first batch); prompts stay on the host as they are."""

    def __init__(self, step: int, problems: list[Problem], prompt_ids: list[list[int]]) -> None:
        self.step, self.problems, self.prompt_ids = step, problems, prompt_ids

    def __repr__(self) -> str:
        return f"PromptBatch(step={self.step}, {len(self.problems)} problems)"


def rank_shard(count: int, rank: int, world_size: int, field: str) -> slice:
    """Rank r's contiguous slice of a global batch of `count` prompts."""
    if count % world_size:
        raise ValueError(f"{field}={count} must be divisible by the {world_size} training processes")
    return slice(rank * count // world_size, (rank + 1) * count // world_size)
