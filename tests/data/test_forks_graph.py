"""The forks task's graphs: fork positions, decisions, where a path leaves the graph and how a response fails,
against a brute-force search of every continuation; the path reward, the text round trip, and the generator's
shapes."""

from __future__ import annotations

import random
import string

import pytest

from tokenrl.data.forks_graph import (
    STOP,
    Graph,
    GraphShape,
    fork_positions,
    layered_graph,
    path_marks,
    path_reward,
    random_walk,
    reachable_goal,
)


def random_small_graph(rng: random.Random) -> Graph:
    """Any directed graph on 1–7 nodes (cycles and self-loops allowed), 0–3 goals, any start."""
    nodes = list(string.ascii_uppercase[: rng.randint(1, 7)])
    successors = {node: tuple(rng.sample(nodes, rng.randint(0, min(3, len(nodes))))) for node in nodes}
    goals = frozenset(rng.sample(nodes, rng.randint(0, min(3, len(nodes)))))
    return Graph(successors, rng.choice(nodes), goals)


def can_succeed(graph: Graph, node: str, budget: int) -> bool:
    """Brute force: some continuation from `node` of at most `budget` more nodes ends by stopping at a goal."""
    for option in graph.options(node):
        if option == STOP or (budget > 0 and can_succeed(graph, option, budget - 1)):
            return True
    return False


def brute_force_forks(graph: Graph, response: str) -> list[bool]:
    """Every decision of `response` by enumerating its options' continuations (no backward search)."""
    budget = len(graph.nodes())  # a simple path reaches any reachable goal within as many nodes
    marks = [False] * (len(response) + 1)
    for t in range(1, len(response) + 1):
        prefix = response[:t]
        follows = prefix[0] == graph.start and all(b in graph.successors.get(a, ()) for a, b in zip(prefix, prefix[1:]))
        if not follows:
            continue
        options = graph.options(prefix[-1])
        outcomes = [option == STOP or can_succeed(graph, option, budget) for option in options]
        marks[t] = len(options) >= 2 and any(outcomes) and not all(outcomes)
    return marks


def responses_for(graph: Graph, rng: random.Random) -> list[str]:
    letters = sorted(graph.nodes()) + ["x", " "]
    walks = [random_walk(graph, rng, 8) for _ in range(4)]
    noise = ["".join(rng.choice(letters) for _ in range(rng.randint(0, 6))) for _ in range(4)]
    return walks + noise + [graph.start + w for w in noise] + [""]


def test_fork_positions_equal_a_brute_force_search_on_random_graphs():
    rng = random.Random(0)
    kinds = {"no_path": 0, "start_is_goal": 0, "several_goals": 0, "forks": 0}
    for _ in range(400):
        graph = random_small_graph(rng)
        kinds["no_path"] += graph.start not in graph.reaching()
        kinds["start_is_goal"] += graph.start in graph.goals
        kinds["several_goals"] += len(graph.goals) > 1
        for response in responses_for(graph, rng):
            marks = fork_positions(graph, response)
            assert marks == brute_force_forks(graph, response), (graph, response)
            kinds["forks"] += any(marks)
    assert min(kinds.values()) > 20, kinds  # every case the issue names occurred many times


def follows(graph: Graph, prefix: str) -> bool:
    """`prefix` is a path of the graph from the start (the empty prefix too)."""
    return not prefix or (
        prefix[0] == graph.start and all(b in graph.successors.get(a, ()) for a, b in zip(prefix, prefix[1:]))
    )


def brute_force_marks(graph: Graph, response: str, ended: bool) -> dict:
    """Decisions, on-graph and invalid positions and the failure, position by position from the definitions: a
    prefix is winnable when it follows the graph and some continuation of at most |nodes| more nodes stops at a goal
    (enumerated: `can_succeed`); the failure is decided at the first choice that turns winnable into not."""
    budget, n = len(graph.nodes()), len(response)
    on_graph = [t == 0 or (follows(graph, response[:t]) and bool(graph.options(response[t - 1]))) for t in range(n + 1)]
    decisions = [t > 0 and on_graph[t] and len(graph.options(response[t - 1])) >= 2 for t in range(n + 1)]
    valid_stop = n > 0 and response[-1] in graph.goals
    invalid = [on_graph[t] and not follows(graph, response[: t + 1]) for t in range(n)]
    invalid.append(on_graph[n] and ended and not valid_stop)

    def winnable(prefix: str, stopped: bool = False) -> bool:
        if not prefix:
            return not stopped  # the start is still to be written, unless the response ended before it
        if not follows(graph, prefix):
            return False
        return prefix[-1] in graph.goals if stopped else can_succeed(graph, prefix[-1], budget)

    failure, decisive = "none" if path_reward(response, graph.encode()) == 1.0 else "", None
    for t in range(n + 1):
        if failure:
            break
        if t == n and not ended:
            failure = "out_of_tokens"
            break
        before, after = winnable(response[:t]), winnable(response[: t + 1], stopped=t == n)
        if before and not after:
            if invalid[t]:
                failure, decisive = ("early_stop" if t == n else "invalid_letter"), t
            else:
                failure, decisive = ("unreachable", None) if t == 0 else ("wrong_branch", t)
    return {"decisions": decisions, "on_graph": on_graph, "invalid": invalid, "failure": failure, "decisive": decisive}


def test_path_marks_equal_a_brute_force_search_on_random_graphs():
    rng = random.Random(6)
    seen = {way: 0 for way in ("none", "wrong_branch", "invalid_letter", "early_stop", "out_of_tokens", "unreachable")}
    for _ in range(300):
        graph = random_small_graph(rng)
        for response in responses_for(graph, rng):
            for ended in (True, False):
                marks = path_marks(graph, response, ended)
                expected = brute_force_marks(graph, response, ended)
                assert marks.forks == fork_positions(graph, response), (graph, response)
                got = {key: getattr(marks, key) for key in expected}
                assert got == expected, (graph, response, ended)
                assert all(d for f, d in zip(marks.forks, marks.decisions) if f)  # forks are decisions
                if marks.failure == "wrong_branch":
                    assert marks.forks[marks.decisive]  # a wrong branch is taken at a fork
                seen[marks.failure] += 1
    assert min(seen.values()) > 20, seen  # every way of failing occurred many times


def test_the_ways_of_failing_on_a_small_graph():
    graph = Graph({"A": ("B", "C"), "B": ("D",), "C": (), "D": ()}, "A", frozenset("D"))
    assert path_marks(graph, "ABD", ended=True).failure == "none"
    assert path_marks(graph, "ABD", ended=False).failure == "none"  # the reward reads the text: a path to the goal
    wrong = path_marks(graph, "AC", ended=True)
    assert (wrong.failure, wrong.decisive, wrong.forks, wrong.invalid, wrong.on_graph) == (
        "wrong_branch",
        1,
        [False, True, False],
        [False, False, False],  # C is a dead end: its stop is no choice, so not an invalid token
        [True, True, False],
    )
    letter = path_marks(graph, "ABX", ended=True)
    assert (letter.failure, letter.decisive, letter.decisions, letter.on_graph) == (
        "invalid_letter",
        2,
        [False, True, False, False],  # after B one option (D): forced
        [True, True, True, False],
    )
    assert (path_marks(graph, "AB", ended=True).failure, path_marks(graph, "AB", ended=True).decisive) == (
        "early_stop",
        2,
    )
    assert path_marks(graph, "AB", ended=False).failure == "out_of_tokens"
    assert path_marks(graph, "", ended=True).failure == "early_stop"
    assert path_marks(graph, "B", ended=True).failure == "invalid_letter"


def test_path_reward_is_one_exactly_for_paths_from_the_start_to_a_goal():
    rng = random.Random(1)
    for _ in range(300):
        graph = random_small_graph(rng)
        for response in responses_for(graph, rng):
            follows = (
                bool(response)
                and response[0] == graph.start
                and all(b in graph.successors.get(a, ()) for a, b in zip(response, response[1:]))
            )
            expected = float(follows and response[-1] in graph.goals)
            assert path_reward(response, graph.encode()) == expected, (graph, response)


def test_a_one_node_path_succeeds_and_decides_nothing_when_the_start_is_a_sink_goal():
    graph = Graph({"A": ()}, "A", frozenset("A"))
    assert path_reward("A", graph.encode()) == 1.0
    assert fork_positions(graph, "A") == [False, False]


def test_the_stop_decision_at_a_goal_with_a_dead_end_successor_is_a_fork():
    graph = Graph({"A": ("B",), "B": ("C",), "C": ()}, "A", frozenset("B"))
    assert fork_positions(graph, "AB") == [False, False, True]  # after B: stop (wins) or C (dead end)
    assert fork_positions(graph, "ABC") == [False, False, True, False]


def sample_graph(shape: GraphShape, rng: random.Random) -> Graph:
    successors, layers = layered_graph(shape, rng)
    start = rng.choice(layers[0])
    return Graph(successors, start, frozenset({reachable_goal(successors, start, layers[-1], rng) or layers[-1][0]}))


def test_encode_and_decode_round_trip_and_bad_text_names_the_format():
    graph = sample_graph(GraphShape(width=4, layers=4, branching=3, distractors=2), random.Random(2))
    assert Graph.decode(graph.encode()) == graph
    with pytest.raises(ValueError, match="edges|start|goals"):
        Graph.decode("not a graph")


@pytest.mark.parametrize(
    "shape",
    [
        GraphShape(),
        GraphShape(width=4, layers=6, branching=3),
        GraphShape(width=3, layers=3, branching=1),
        GraphShape(distractors=4),
    ],
)
def test_layered_graphs_have_the_shape_the_config_names(shape: GraphShape):
    rng = random.Random(3)
    for _ in range(30):
        successors, layers = layered_graph(shape, rng)
        assert (
            len(successors) == shape.node_count() and [len(layer) for layer in layers] == [shape.width] * shape.layers
        )
        dead_ends = set(successors) - {node for layer in layers for node in layer}
        assert len(dead_ends) == shape.distractors and all(successors[node] == () for node in dead_ends)
        for i, layer in enumerate(layers[:-1]):
            for node in layer:
                inside = [v for v in successors[node] if v not in dead_ends]
                assert len(inside) == len(set(inside)) == shape.branching and set(inside) <= set(layers[i + 1])
        assert all(successors[node] == () for node in layers[-1])


def test_the_goal_drawn_is_reachable_and_none_when_no_goal_is():
    rng = random.Random(5)
    for _ in range(50):
        successors, layers = layered_graph(GraphShape(width=4, layers=4, branching=1), rng)
        start = layers[0][0]
        goal = reachable_goal(successors, start, layers[-1], rng)
        assert goal is not None and start in Graph(successors, start, frozenset({goal})).reaching()
    assert reachable_goal({"A": ("B",), "B": (), "C": ()}, "A", ["C"], rng) is None


def test_a_random_walk_follows_the_edges_and_the_question_lists_every_edge():
    rng = random.Random(4)
    graph = sample_graph(GraphShape(width=3, layers=4, distractors=2), rng)
    pairs = graph.question().split("\n")[0].split()
    for node, succ in graph.successors.items():
        for nxt in succ or ".":
            assert f"{node}{nxt}" in pairs
    assert graph.question(with_edges=False) == f"{graph.start}..{next(iter(graph.goals))}"
    for _ in range(50):
        walk = random_walk(graph, rng, 8)
        assert walk[0] == graph.start and all(b in graph.successors[a] for a, b in zip(walk, walk[1:]))


def test_a_shape_that_needs_more_labels_than_there_are_letters_is_refused_naming_the_options():
    with pytest.raises(ValueError, match="lower task.width"):
        GraphShape(width=10, layers=6).check()
    with pytest.raises(ValueError, match="task.branching=3"):
        GraphShape(width=2, branching=3).check()
