"""data/forks.py: `task=forks` problems are seeded, train and test differ, the answer carries the graph the reward and
the forks are computed from, and a budget too short for a path is refused naming the option."""

from __future__ import annotations

import pytest

from tokenrl.data.forks import ForksTask
from tokenrl.data.forks_graph import Graph, fork_positions, path_marks, path_reward


def forks_task(**changes) -> ForksTask:
    settings = dict(
        layout="shared",
        width=5,
        layers=5,
        branching=2,
        distractors=1,
        train_size=50,
        test_size=10,
        seed=5,
        max_new_tokens=8,
    )
    return ForksTask(**{**settings, **changes})


@pytest.mark.parametrize("layout", ["shared", "per_problem"])
def test_problems_are_seeded_and_the_test_split_asks_what_training_does_not(layout):
    task = forks_task(layout=layout)
    assert task.problems("train") == forks_task(layout=layout).problems("train")
    assert task.problems("train") != forks_task(layout=layout, seed=6).problems("train")
    assert len(task.problems("test")) == 10
    assert not {p.question for p in task.problems("train")} & {p.question for p in task.problems("test")}


def test_the_shared_layout_asks_routes_of_one_graph_and_holds_routes_out():
    task = forks_task()
    assert all(Graph.decode(p.answer).successors == task.graph for p in task.problems("train") + task.problems("test"))
    routes = len(task.routes["train"]) + len(task.routes["test"])
    with pytest.raises(ValueError, match=f"task.test_size={routes} must be in"):
        forks_task(test_size=routes)


@pytest.mark.parametrize("layout", ["shared", "per_problem"])
def test_the_answer_is_the_graph_the_question_shows_and_the_reward_and_forks_read_it(layout):
    task = forks_task(layout=layout)
    for problem in task.problems("test") + task.problems("train")[:20]:
        graph = Graph.decode(problem.answer)
        assert task.question_text(problem) == graph.question(with_edges=layout == "per_problem")
        solution = solve(graph)
        assert path_reward(solution, problem.answer) == 1.0
        marks = task.forks_of(problem, solution)
        assert marks == path_marks(graph, solution, ended=True) and marks.forks == fork_positions(graph, solution)
        assert marks.failure == "none" and task.forks_of(problem, solution[:-1], ended=True).failure == "early_stop"


def solve(graph: Graph) -> str:
    """The path to the goal, following the successors that reach it."""
    reaching, path = graph.reaching(), graph.start
    while path[-1] not in graph.goals:
        path += next(v for v in graph.successors[path[-1]] if v in reaching)
    return path


def test_a_budget_too_short_for_the_path_and_its_end_token_is_refused():
    with pytest.raises(ValueError, match="task.max_new_tokens=5.*at least 6"):
        forks_task(max_new_tokens=5)
    with pytest.raises(ValueError, match="task.layout='maze'"):
        forks_task(layout="maze")
