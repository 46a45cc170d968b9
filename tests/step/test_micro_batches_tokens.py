"""step/micro_batches.py with a token budget (`max_tokens`): every row once, each micro-batch within the budget by
its cost (packed: each group's prompt once + its responses; shared prefix: groups × longest prompt + rows × longest
response; padded: rows × (longest prompt + longest response); or, untrimmed, the batch's full widths in place of the
longest) unless it is one unit that alone exceeds it, greedy (the next unit would not have fit), whole groups kept
together, and the order of `by_length` kept. Random batches as in test_micro_batches.py (partial groups from a
shuffled half)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.step.test_micro_batches import groups_in, micro_batches, minibatch, random_batch
from tokenrl.step.micro_batches import MicroBatchCut


def prompt_lengths_of(group_ids: torch.Tensor, seed: int) -> torch.Tensor:
    """One prompt length per group (2..9), repeated over its rows."""
    g = torch.Generator().manual_seed(500 + seed)
    per_group = torch.randint(2, 10, (int(group_ids.max()) + 1,), generator=g)
    return per_group[group_ids]


def rows_of(rows, group_ids, lengths, prompts):
    """The (group, prompt length, response length) of each of `rows`."""
    return [(int(group_ids[i]), int(prompts[i]), int(lengths[i])) for i in rows.tolist()]


FULL = (11, 7)  # (prompt, response) columns of an untrimmed forward: wider than any row's lengths


def cost(positions: list[int], rows, group_ids, lengths, prompts, kind: str, full=None) -> int:
    index = rows[torch.tensor(positions)]
    groups = {int(group_ids[i]): int(prompts[i]) for i in index}
    if kind == "packed":
        return sum(groups.values()) + int(lengths[index].sum())
    prompt, response = full or (int(prompts[index].max()), int(lengths[index].max()))
    return (len(groups) if kind == "shared_prefix" else len(positions)) * prompt + len(positions) * response


def cases():
    for seed, budget, fraction in itertools.product(range(6), [6, 15, 40, 1000], [1.0, 0.5]):
        group_ids, lengths = random_batch(seed)
        yield group_ids, lengths, prompt_lengths_of(group_ids, seed), minibatch(seed, len(group_ids), fraction), budget


@pytest.mark.parametrize(
    "kind, full",
    [("packed", None), ("shared_prefix", None), ("padded", None), ("shared_prefix", FULL), ("padded", FULL)],
    ids=["packed", "shared_prefix", "padded", "shared_prefix_untrimmed", "padded_untrimmed"],
)
@pytest.mark.parametrize("whole_groups", [False, True])
@pytest.mark.parametrize("by_length", [False, True])
def test_token_budget_contract(kind, full, whole_groups, by_length):
    over_budget = 0
    for group_ids, lengths, prompts, rows, budget in cases():
        cut = MicroBatchCut(1, budget, kind, by_length=by_length)  # max_rows yields to the budget
        chunks = cut.split(rows_of(rows, group_ids, lengths, prompts), whole_groups, full)
        sequence = torch.cat(chunks).tolist()
        assert sorted(sequence) == list(range(len(rows)))
        # the order is the row-count cut's order (groups by length or in id order, rows in order)
        same_order = micro_batches(rows, group_ids, lengths, len(rows), whole_groups, by_length)
        assert sequence == torch.cat(same_order).tolist()
        groups = groups_in(rows, group_ids)
        units = groups if whole_groups else [[p] for p in sequence]
        for chunk in map(torch.Tensor.tolist, chunks):
            if cost(chunk, rows, group_ids, lengths, prompts, kind, full) > budget:
                assert chunk in units, "only a single unit may exceed the budget"
                over_budget += 1
        for chunk, following in zip(chunks, chunks[1:]):
            nxt = next(unit for unit in units if unit[0] == following[0].item())
            grown = chunk.tolist() + nxt
            assert cost(grown, rows, group_ids, lengths, prompts, kind, full) > budget, "two micro-batches could be one"
        if whole_groups:
            for group in groups:
                holder = [c.tolist() for c in chunks if group[0] in c.tolist()][0]
                assert set(group) <= set(holder)
    assert over_budget > 0  # the small budgets do hold units larger than the budget


def test_packed_cost_counts_a_prompt_once_per_micro_batch():
    """Hand-made: groups {0,1} (prompt 4) and {2} (prompt 3), responses 2, 3, 5. Packed: group 0 costs 4 + 5 = 9,
    group 1 costs 3 + 5 = 8; a budget of 9 holds group 0, not both; 17 holds both. Split rows pay the prompt again."""
    group_ids, lengths, prompts = torch.tensor([0, 0, 1]), torch.tensor([2, 3, 5]), torch.tensor([4, 4, 3])
    rows = torch.arange(3)
    cut = lambda budget, whole=True, kind="packed": [  # noqa: E731
        c.tolist() for c in MicroBatchCut(1, budget, kind).split(rows_of(rows, group_ids, lengths, prompts), whole)
    ]
    assert cut(9) == [[0, 1], [2]]
    assert cut(17) == [[0, 1, 2]]
    assert cut(16) == [[0, 1], [2]]
    assert cut(8, whole=False) == [[0], [1], [2]]  # 4+2 = 6, + 3 = 9 > 8: row 1 starts again with its prompt
    assert cut(9, whole=False) == [[0, 1], [2]]
    assert cut(14, kind="padded") == [[0, 1], [2]]  # 2 × (4 + 3) = 14; with row 2: 3 × (4 + 5) = 27
    assert cut(10, kind="shared_prefix") == [[0, 1], [2]]  # 4 + 2 × 3 = 10; with row 2: 2 × 4 + 3 × 5 = 23
    assert cut(23, kind="shared_prefix") == [[0, 1, 2]]


def test_token_budget_needs_a_known_cost():
    with pytest.raises(ValueError, match="not one of"):
        MicroBatchCut(1, 4, "x").split([(0, 1, 1), (1, 1, 1)])
