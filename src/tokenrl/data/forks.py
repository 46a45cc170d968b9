"""`task=forks`: paths through small random graphs, a task whose forking tokens are known exactly.

Each problem is a graph of `data/forks_graph.py` (its shape set in the config); the reward is 1 for a path from the
start to the goal. The fork positions of every sampled response are computed from the problem and the response
(`Task.forks_of`), so a selector's choice can be scored against the truth (diagnostics.py, `forks/*`). A model
trained from scratch first learns the format — random valid walks, supervised (`warmup`, models/warmup.py) — so that
reinforcement learning has to learn which branch reaches the goal.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

from tokenrl.data.forks_graph import Graph, GraphShape, fork_positions, random_graph, random_walk
from tokenrl.data.records import Problem
from tokenrl.data.tasks import Task

VERIFIER = "tokenrl.data.forks_graph:path_reward"


class ForksTask(Task):
    """Train and test graphs drawn from disjoint seeds; `warmup` (steps, batch_size, lr, seed) configures the
    supervised warm-up of a randomly initialised policy on random valid walks (None: none)."""

    def __init__(self, depth: int, branching: int, dead_end_length: int, free_prob: float, distractors: int,
                 train_size: int, test_size: int, seed: int, max_new_tokens: int,
                 warmup: Mapping[str, Any] | None = None, instruction: str = "",
                 verifier: str = VERIFIER) -> None:
        super().__init__(instruction, verifier, max_new_tokens)
        self.shape = GraphShape(depth, branching, dead_end_length, free_prob, distractors)
        self.shape.check()
        if max_new_tokens < depth + 2:
            raise ValueError(f"task.max_new_tokens={max_new_tokens} cannot hold a path of depth {depth} and its end "
                             f"token: set it to at least {depth + 2}")
        self.sizes = {"train": train_size, "test": test_size}
        self.seed = seed
        self.warmup = dict(warmup) if warmup else None

    def problems(self, split: str) -> list[Problem]:
        rng = random.Random(f"{self.seed}-{split}")
        return [self._problem(f"{split}-{i}", random_graph(self.shape, rng)) for i in range(self.sizes[split])]

    def _problem(self, problem_id: str, graph: Graph) -> Problem:
        return Problem(problem_id, graph.question(), graph.encode(), self.verifier)

    def forks_of(self, problem: Problem, response: str) -> list[bool]:
        return fork_positions(Graph.decode(problem.answer), response)

    def warmup_example(self, rng: random.Random) -> tuple[str, str]:
        """(question, response) of the warm-up: a fresh graph (not from either split) and a random valid walk on it."""
        graph = random_graph(self.shape, rng)
        return self.question_text(self._problem("warmup", graph)), random_walk(graph, rng, self.max_new_tokens - 1)

    def description(self) -> dict[str, Any]:
        """What determines the graphs (the warm-up's cache key)."""
        return {"shape": vars(self.shape), "max_new_tokens": self.max_new_tokens, "instruction": self.instruction}
