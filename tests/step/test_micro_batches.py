"""step/micro_batches.py: how a mini-batch's rows are cut into micro-batches, checked against the contract on
random batches (groups of different sizes, some larger than a micro-batch; mini-batches drawn by a shuffle, so
groups arrive partial and the positions into `rows` differ from the row ids)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tokenrl.step.micro_batches import MicroBatchCut


def micro_batches(rows, group_ids, lengths, max_rows, whole_groups=False, by_length=False):
    """`MicroBatchCut.split` of `rows` (row ids into group_ids / response lengths; prompts of no tokens)."""
    lengths_of_rows = [(int(group_ids[i]), 0, int(lengths[i])) for i in rows.tolist()]
    return MicroBatchCut(max_rows, by_length=by_length).split(lengths_of_rows, whole_groups)


def random_batch(seed: int, n_groups: int = 7, max_group: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """(group_ids, response_lengths) of a group-major batch with groups of 1..max_group rows; lengths have ties."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, max_group + 1, (n_groups,), generator=g)
    group_ids = torch.repeat_interleave(torch.arange(n_groups), sizes)
    return group_ids, torch.randint(1, 6, (len(group_ids),), generator=g)


def minibatch(seed: int, size: int, fraction: float) -> torch.Tensor:
    """Sorted row ids of a shuffled mini-batch holding `fraction` of the rows (partial groups)."""
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randperm(size, generator=g)[: max(1, int(size * fraction))].sort().values


def groups_in(rows: torch.Tensor, group_ids: torch.Tensor) -> list[list[int]]:
    """Positions into `rows` of each group present, groups in id order, positions ascending (computed directly)."""
    ids = group_ids[rows].tolist()
    return [[p for p, i in enumerate(ids) if i == g] for g in sorted(set(ids))]


def longest(group: list[int], rows: torch.Tensor, lengths: torch.Tensor) -> int:
    return max(int(lengths[rows[p]]) for p in group)


def cases():
    """(group_ids, response_lengths, rows, max_rows) over seeds, micro-batch sizes below, at and above the group
    sizes, and whole or half mini-batches (a shuffled half leaves groups partial)."""
    for seed, max_rows, fraction in itertools.product(range(8), [1, 3, 4, 8], [1.0, 0.5]):
        group_ids, lengths = random_batch(seed)
        yield group_ids, lengths, minibatch(seed, len(group_ids), fraction), max_rows


@pytest.mark.parametrize("whole_groups", [False, True])
@pytest.mark.parametrize("by_length", [False, True])
def test_every_row_once_within_size(whole_groups, by_length):
    """Every position of `rows` in exactly one micro-batch; each at most max_rows rows, or — with whole_groups —
    exactly one group larger than max_rows."""
    oversized = 0
    for group_ids, lengths, rows, max_rows in cases():
        chunks = micro_batches(rows, group_ids, lengths, max_rows, whole_groups, by_length)
        assert all(c.dtype == torch.long and c.dim() == 1 and len(c) > 0 for c in chunks)
        assert sorted(torch.cat(chunks).tolist()) == list(range(len(rows)))
        groups = groups_in(rows, group_ids)
        for chunk in chunks:
            if len(chunk) > max_rows:
                assert whole_groups and sorted(chunk.tolist()) in groups, "an oversized micro-batch must be one group"
                oversized += 1
    assert oversized > 0 or not whole_groups  # the cases do hold groups larger than max_rows


@pytest.mark.parametrize("by_length", [False, True])
def test_whole_groups_never_split_and_packed_greedily(by_length):
    """whole_groups: each group's rows lie in one micro-batch, contiguous and in row order; groups are packed in
    order, a new micro-batch starting only when the next group would overflow max_rows (no needless small forwards)."""
    for group_ids, lengths, rows, max_rows in cases():
        chunks = [c.tolist() for c in micro_batches(rows, group_ids, lengths, max_rows, True, by_length)]
        groups = groups_in(rows, group_ids)
        assert sorted(p for chunk in chunks for p in chunk) == list(range(len(rows)))
        for group in groups:
            holder = [chunk for chunk in chunks if group[0] in chunk]
            start = holder[0].index(group[0])
            assert holder[0][start : start + len(group)] == group, f"group {group} split or out of row order"
        for chunk, following in zip(chunks, chunks[1:]):
            first_next = next(group for group in groups if group[0] == following[0])
            assert len(chunk) + len(first_next) > max_rows, "two micro-batches could have been one"


@pytest.mark.parametrize("whole_groups", [False, True])
def test_by_length_orders_groups_by_longest_response_descending_stable(whole_groups):
    """by_length: groups follow each other by their longest response (over the rows present), descending, ties in
    group order; rows within a group keep their order. Without whole_groups the cut is that order split by max_rows."""
    for group_ids, lengths, rows, max_rows in cases():
        groups = groups_in(rows, group_ids)
        expected = sorted(groups, key=lambda group: -longest(group, rows, lengths))  # sorted() is stable
        chunks = micro_batches(rows, group_ids, lengths, max_rows, whole_groups, True)
        sequence = torch.cat(chunks).tolist()
        assert sequence == [p for group in expected for p in group]
        if not whole_groups:
            assert [c.tolist() for c in chunks] == [c.tolist() for c in torch.tensor(sequence).split(max_rows)]


def test_row_order_kept_without_by_length():
    """by_length=False: rows keep their order; without whole_groups the cut is `torch.arange(n).split(max_rows)`."""
    for group_ids, lengths, rows, max_rows in cases():
        plain = micro_batches(rows, group_ids, lengths, max_rows)
        assert [c.tolist() for c in plain] == [c.tolist() for c in torch.arange(len(rows)).split(max_rows)]
        whole = micro_batches(rows, group_ids, lengths, max_rows, whole_groups=True)
        assert torch.cat(whole).tolist() == list(range(len(rows)))


def test_positions_not_row_ids_and_lengths_read_through_rows():
    """Hand-made: rows [1, 2, 4, 5, 7] of a batch whose groups are {0,1,2}, {3,4,5}, {6,7}; the longest response of
    each group is read at its rows in the full batch, and the answer is positions 0..4 into `rows`."""
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    lengths = torch.tensor([9, 1, 2, 9, 3, 1, 9, 5])  # the 9s are not in the mini-batch
    rows = torch.tensor([1, 2, 4, 5, 7])
    chunks = micro_batches(rows, group_ids, lengths, 2, whole_groups=True, by_length=True)
    assert [c.tolist() for c in chunks] == [[4], [2, 3], [0, 1]]  # longest 5, 3, 2
    chunks = micro_batches(rows, group_ids, lengths, 3, whole_groups=False, by_length=True)
    assert [c.tolist() for c in chunks] == [[4, 2, 3], [0, 1]]


def test_by_length_ties_keep_group_order():
    """Groups with equal longest responses stay in group order (a stable sort), whichever group comes first."""
    group_ids = torch.tensor([0, 0, 1, 2, 2, 3])
    lengths = torch.tensor([2, 4, 7, 1, 4, 4])  # longest: 4, 7, 4, 4
    chunks = micro_batches(torch.arange(6), group_ids, lengths, 2, whole_groups=True, by_length=True)
    assert [c.tolist() for c in chunks] == [[2], [0, 1], [3, 4], [5]]
    chunks = micro_batches(torch.arange(6), group_ids, lengths, 4, whole_groups=False, by_length=True)
    assert [c.tolist() for c in chunks] == [[2, 0, 1, 3], [4, 5]]


def test_a_group_larger_than_max_rows_is_its_own_micro_batch():
    """whole_groups: a group of 5 with max_rows=2 is one micro-batch, its neighbours not merged into it."""
    group_ids = torch.tensor([0, 1, 1, 1, 1, 1, 2])
    lengths = torch.ones(7, dtype=torch.long)
    chunks = micro_batches(torch.arange(7), group_ids, lengths, 2, whole_groups=True)
    assert [c.tolist() for c in chunks] == [[0], [1, 2, 3, 4, 5], [6]]


def test_empty_minibatch_gives_no_micro_batches():
    group_ids, lengths = random_batch(0)
    for whole_groups, by_length in itertools.product([False, True], repeat=2):
        assert micro_batches(torch.zeros(0, dtype=torch.long), group_ids, lengths, 4, whole_groups, by_length) == []
