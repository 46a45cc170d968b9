"""data/forks.py: `task=forks` problems are seeded, train and test differ, the answer carries the graph the reward and
the forks are computed from, and a budget too short for a path is refused naming the option."""
from __future__ import annotations

import pytest

from tokenrl.data.forks import ForksTask
from tokenrl.data.forks_graph import Graph, fork_positions, path_reward


def forks_task(**changes) -> ForksTask:
    settings = dict(depth=3, branching=2, dead_end_length=1, free_prob=0.2, distractors=1, train_size=50,
                    test_size=20, seed=5, max_new_tokens=8)
    return ForksTask(**{**settings, **changes})


def test_problems_are_seeded_and_the_splits_differ():
    task = forks_task()
    assert task.problems("train") == forks_task().problems("train")
    assert task.problems("train") != forks_task(seed=6).problems("train")
    assert not {p.question for p in task.problems("train")} & {p.question for p in task.problems("test")}


def test_the_answer_is_the_graph_the_question_shows_and_the_reward_and_forks_read_it():
    task = forks_task()
    for problem in task.problems("test"):
        graph = Graph.decode(problem.answer)
        assert task.question_text(problem) == graph.question()
        solution = solve(graph)
        assert path_reward(solution, problem.answer) == 1.0
        assert task.forks_of(problem, solution) == fork_positions(graph, solution)
        assert sum(task.forks_of(problem, solution)) >= 1


def solve(graph: Graph) -> str:
    """The path to the goal, following the successors that reach it."""
    reaching, path = graph.reaching(), graph.start
    while path[-1] not in graph.goals:
        path += next(v for v in graph.successors[path[-1]] if v in reaching)
    return path


def test_a_budget_too_short_for_the_path_and_its_end_token_is_refused():
    with pytest.raises(ValueError, match="task.max_new_tokens=4.*at least 5"):
        forks_task(max_new_tokens=4)
