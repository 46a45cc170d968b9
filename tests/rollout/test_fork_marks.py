"""rollout/fork_marks.py: the true forks of sampled responses (and the decisions, the positions on and off the graph,
the failures), token by token, for one-character and multi-character tokens, with and without the end-of-sequence
token; tasks that cannot name forks give none."""

from __future__ import annotations

import random

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tokenrl.data.forks import ForksTask
from tokenrl.data.forks_graph import Graph, fork_positions, path_marks, random_walk
from tokenrl.data.tasks import ArithmeticTask
from tokenrl.models.char_tokenizer import build_char_tokenizer
from tokenrl.records.marks import FAILURES, POSITION_MARKS
from tokenrl.records.problem import Problem
from tokenrl.rollout.fork_marks import ForkMarker, token_marks


def pair_tokenizer() -> PreTrainedTokenizerFast:
    """Tokens of two letters (`AB`), or one at the end of an odd-length text."""
    letters = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for a in letters:
        vocab[a] = len(vocab)
        for b in letters:
            vocab[a + b] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"..?"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def task() -> ForksTask:
    return ForksTask(
        layout="per_problem",
        width=4,
        layers=5,
        branching=2,
        distractors=3,
        train_size=30,
        test_size=5,
        seed=7,
        max_new_tokens=10,
    )


def rollout(tokenizer, responses: list[str], ended: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [
        tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if end else [])
        for text, end in zip(responses, ended)
    ]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask


def test_one_character_tokens_carry_the_character_marks_and_the_end_token_the_stop_decision():
    forks_task, tokenizer, rng = task(), build_char_tokenizer(128), random.Random(0)
    problems = forks_task.problems("train")
    responses = [random_walk(Graph.decode(p.answer), rng, 9) for p in problems]
    responses = [text if i % 5 else text[:-1] + "z" for i, text in enumerate(responses)]  # some leave the graph
    ended = [i % 4 != 0 for i in range(len(problems))]  # every fourth row cut at the budget: no end token
    ids, mask = rollout(tokenizer, responses, ended)
    marks = ForkMarker(forks_task.forks_of, tokenizer)(problems, ids, mask, responses)
    for name in POSITION_MARKS:
        values = getattr(marks, name)
        assert values.shape == ids.shape and not values[mask == 0].any(), name
    assert marks.forks.any() and marks.decisions.any() and marks.invalid.any()
    for row, (problem, text, end) in enumerate(zip(problems, responses, ended)):
        chars = path_marks(Graph.decode(problem.answer), text, end)
        assert chars.forks == fork_positions(Graph.decode(problem.answer), text)
        for name, truth in chars.positions().items():
            values = getattr(marks, name)[row]
            assert values[: len(text)].tolist() == truth[: len(text)], name
            if end:
                assert bool(values[len(text)]) == truth[len(text)], name
            assert not values[len(text) + end :].any(), name
        assert FAILURES[int(marks.failure[row])] == chars.failure


def test_a_multi_character_token_is_a_fork_when_any_of_its_characters_is():
    tokenizer = pair_tokenizer()
    rng = random.Random(1)
    for _ in range(200):
        text = "".join(rng.choice("ABCD") for _ in range(rng.randint(1, 7)))
        chars = [rng.random() < 0.3 for _ in range(len(text) + 1)]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert len(ids) == (len(text) + 1) // 2 + 1
        expected = [any(chars[i : min(i + 2, len(text))]) for i in range(0, len(text), 2)] + [chars[len(text)]]
        assert token_marks(chars, ids, tokenizer, ended=True) == expected
        assert token_marks(chars, ids[:-1], tokenizer, ended=False) == expected[:-1]


def test_a_task_that_cannot_name_its_forks_gives_none():
    arithmetic = ArithmeticTask(0, 9, ["+"], 4, 2, 0, "Answer.", "gsm8k_flexible")
    tokenizer = build_char_tokenizer(128)
    ids, mask = rollout(tokenizer, ["12", "7"], [True, True])
    problems = arithmetic.problems("train")[:2]
    assert ForkMarker(arithmetic.forks_of, tokenizer)(problems, ids, mask, ["12", "7"]) is None
    assert isinstance(problems[0], Problem)
