"""`task=forks`: paths through layered graphs, a task whose forking tokens are known exactly.

A problem names a start and a goal (`B..X`); the answer is a path along the graph's edges, one letter per node. With
`layout: shared` one seeded graph serves every problem and the policy learns it (the prompt is the route alone); the
held-out test routes are (start, goal) pairs no training problem asks for. With `layout: per_problem` every problem
has its own graph, listed in the prompt (a model must read it: harder). The reward is 1 for a path to the goal; the
forks, the decisions and the way each sampled response fails are computed from the problem and the response
(`Task.forks_of`, `forks_graph.path_marks`), so a selector's choice is scored against the truth
(observe/diagnostics.py, `forks/*`). A model trained from scratch first learns the format from random valid walks
(`warmup`, models/warmup.py), so that RL has to learn which branch reaches the goal.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from tokenrl.data.forks_graph import Graph, GraphShape, layered_graph, path_marks, random_walk, reachable_goal
from tokenrl.data.tasks import Task
from tokenrl.records.marks import CharMarks
from tokenrl.records.problem import Problem
from tokenrl.records.rules import integer, mapping_of, number, one_of
from tokenrl.records.settings import WarmupSettings

VERIFIER = "tokenrl.data.forks_graph:path_reward"
LAYOUTS = ("shared", "per_problem")


class ForksTask(Task):
    """Train and test problems from disjoint routes (`shared`) or seeds (`per_problem`); `warmup` (steps, batch_size,
    lr, seed) configures the supervised warm-up of a randomly initialised policy (None: none)."""

    verifier: str  # set: only a benchmark's may be null (its own)
    config_rules = {
        **Task.config_rules,
        "layout": one_of(*LAYOUTS),
        "width": integer(1),
        "layers": integer(2),
        "branching": integer(1),
        "distractors": integer(0),
        "train_size": integer(1),
        "test_size": integer(1),
        "seed": integer(0),
        "warmup": mapping_of(
            {"steps": integer(1), "batch_size": integer(1), "lr": number(0, low_open=True), "seed": integer(0)}
        ),
    }

    def __init__(
        self,
        layout: str,
        width: int,
        layers: int,
        branching: int,
        distractors: int,
        train_size: int,
        test_size: int,
        seed: int,
        max_new_tokens: int,
        warmup: Mapping[str, Any] | None = None,
        instruction: str = "",
        verifier: str = VERIFIER,
    ) -> None:
        super().__init__(instruction, verifier, max_new_tokens)
        self.shape = GraphShape(width, layers, branching, distractors)
        self.shape.check()
        if max_new_tokens < layers + 1:
            raise ValueError(
                f"task.max_new_tokens={max_new_tokens} cannot hold a path through {layers} layers and "
                f"its end token: set it to at least {layers + 1}"
            )
        self.layout, self.seed = layout, seed
        self.sizes = {"train": train_size, "test": test_size}
        self.warmup = WarmupSettings.of(warmup) if warmup else None
        self.graph: dict[str, tuple[str, ...]] | None = None
        if layout == "shared":
            self.graph, self.layers = layered_graph(self.shape, random.Random(f"{seed}-graph"))
            self.routes = self._split_routes(self.graph, test_size)

    def _split_routes(self, graph: dict[str, tuple[str, ...]], test_size: int) -> dict[str, list[tuple[str, str]]]:
        """Every (start, goal) of the shared graph with a start at least two layers before the goals and a path
        between them, shuffled by the seed: the first `test_size` are held out."""
        goals = self.layers[-1]
        routes = [
            (start, goal)
            for layer in self.layers[:-2]
            for start in layer
            for goal in goals
            if start in Graph(graph, start, frozenset({goal})).reaching()
        ]
        random.Random(f"{self.seed}-routes").shuffle(routes)
        if not 0 < test_size < len(routes):
            raise ValueError(
                f"task.test_size={test_size} must be in [1, {len(routes) - 1}]: the shared graph has "
                f"{len(routes)} routes and the rest train"
            )
        return {"test": routes[:test_size], "train": routes[test_size:]}

    def problems(self, split: str) -> list[Problem]:
        rng = random.Random(f"{self.seed}-{split}")
        if self.layout == "shared" and split == "test":
            return [self._problem(f"test-{i}", route) for i, route in enumerate(self.routes["test"])]
        return [self._problem(f"{split}-{i}", self._route(rng)) for i in range(self.sizes[split])]

    def _route(self, rng: random.Random) -> tuple[str, str] | Graph:
        """A training route of the shared graph, or a fresh graph with its own route (`per_problem`)."""
        if self.layout == "shared":
            return rng.choice(self.routes["train"])
        while True:
            successors, layers = layered_graph(self.shape, rng)
            start = rng.choice(layers[0])
            goal = reachable_goal(successors, start, layers[-1], rng)
            if goal is not None:
                return Graph(successors, start, frozenset({goal}))

    def _problem(self, problem_id: str, route: tuple[str, str] | Graph) -> Problem:
        if not isinstance(route, Graph):
            assert self.graph is not None  # a (start, goal) route is the shared graph's
            route = Graph(self.graph, route[0], frozenset({route[1]}))
        return Problem(
            problem_id, route.question(with_edges=self.layout == "per_problem"), route.encode(), self.verifier
        )

    def forks_of(self, problem: Problem, response: str, ended: bool = True) -> CharMarks:
        return path_marks(Graph.decode(problem.answer), response, ended)

    def warmup_example(self, rng: random.Random) -> tuple[str, str]:
        """(question, response) of the warm-up: a training route (a fresh graph: `per_problem`) and a random valid
        walk from its start, whatever the goal: the warm-up teaches the format and the edges, not the way."""
        problem = self._problem("warmup", self._route(rng))
        return self.question_text(problem), random_walk(Graph.decode(problem.answer), rng, self.max_new_tokens - 1)

    def description(self) -> dict[str, Any]:
        """What determines the problems (the warm-up's cache key)."""
        return {
            "layout": self.layout,
            "shape": vars(self.shape),
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "instruction": self.instruction,
        }
