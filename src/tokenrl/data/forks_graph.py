"""The forks task's graphs: generation, the text they travel in, the reward of a path, and the exact fork positions.

A problem is a directed graph, a start node and goal nodes; the answer is a path from the start written one node label
(one letter) per character, e.g. `BKX`. At each node the next character is a choice among the node's
successors, plus stopping where the node is a goal. A decision is a **fork** when it has at least two options of
which some still reach a goal and some cannot: the outcome is decided there. The other decisions are **forced**
(one option) or **free** (every option succeeds, or none does). Reward 1: the response is exactly a path that
follows edges from the start and ends at a goal. `path_marks` names, per position, the forks, the decisions (≥ 2
options), where the path leaves the graph, and how a response fails (records/marks.py).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from tokenrl.records.marks import CharMarks

LABELS = string.ascii_uppercase + string.ascii_lowercase
STOP = ""  # the option of ending the path (the response's end-of-sequence token)


@dataclass(frozen=True)
class Graph:
    """Successor lists (node → its successors in prompt order), the start node and the goal nodes."""

    successors: dict[str, tuple[str, ...]]
    start: str
    goals: frozenset[str]

    def encode(self) -> str:
        """`A>BC,B>D,D>|A|D` (edges, start, goals): the problem's answer string, read back by `Graph.decode`."""
        edges = ",".join(f"{node}>{''.join(succ)}" for node, succ in self.successors.items())
        return f"{edges}|{self.start}|{''.join(sorted(self.goals))}"

    @staticmethod
    def decode(text: str) -> Graph:
        try:
            edges, start, goals = text.split("|")
            successors = {}
            for item in filter(None, edges.split(",")):
                node, succ = item.split(">")
                successors[node] = tuple(succ)
        except ValueError:
            raise ValueError(f"{text!r} is not a forks graph (expected 'A>BC,B>D|A|D': edges|start|goals)") from None
        return Graph(successors, start, frozenset(goals))

    def question(self, with_edges: bool = True) -> str:
        """The prompt: `start..goal` (`start..goal1/goal2` for several goals), after the edges as letter pairs `AB`
        (A → B) and each node without successors as `A.` when `with_edges` (the graph varies by problem). Pairs let
        a model find what may follow a node as the characters that follow its earlier occurrences."""
        route = f"{self.start}..{'/'.join(sorted(self.goals))}"
        if not with_edges:
            return route
        edges = " ".join(f"{node}{nxt}" for node, succ in self.successors.items() for nxt in (succ or "."))
        return f"{edges}\n{route}"

    def nodes(self) -> set[str]:
        return {self.start, *self.goals, *self.successors, *(v for succ in self.successors.values() for v in succ)}

    def reaching(self) -> frozenset[str]:
        """The nodes from which some path reaches a goal (the goals included): a backward search from the goals."""
        predecessors: dict[str, set[str]] = {}
        for node, succ in self.successors.items():
            for nxt in succ:
                predecessors.setdefault(nxt, set()).add(node)
        found, frontier = set(self.goals), list(self.goals)
        while frontier:
            for prev in predecessors.get(frontier.pop(), ()):
                if prev not in found:
                    found.add(prev)
                    frontier.append(prev)
        return frozenset(found)

    def options(self, node: str) -> tuple[str, ...]:
        """What may follow `node` in a path: its successors, and `STOP` where it is a goal."""
        return tuple(dict.fromkeys(self.successors.get(node, ()))) + ((STOP,) if node in self.goals else ())


def is_fork(graph: Graph, node: str, reaching: frozenset[str]) -> bool:
    """Whether the decision after `node` has ≥ 2 options of which some, not all, can still end at a goal."""
    options = graph.options(node)
    good = sum(1 for option in options if option == STOP or option in reaching)
    return len(options) >= 2 and 0 < good < len(options)


def fork_positions(graph: Graph, response: str) -> list[bool]:
    """For each character of `response` and its end (index len(response): the stop decision, the end-of-sequence
    token), whether it is a fork decision: the path before it follows the graph from the start, and the node it
    continues from is a fork (`is_fork`). The first character (the start node, named by the prompt) and everything
    after the path leaves the graph are not forks: the outcome is already decided there."""
    reaching = graph.reaching()
    marks = [False] * (len(response) + 1)
    if not response or response[0] != graph.start:
        return marks
    for t in range(1, len(response) + 1):
        node = response[t - 1]
        marks[t] = is_fork(graph, node, reaching)
        if t < len(response) and response[t] not in graph.successors.get(node, ()):
            break  # the path leaves the graph at character t: nothing after it decides anything
    return marks


def path_marks(graph: Graph, response: str, ended: bool) -> CharMarks:
    """Per character of `response` and its end (the stop decision, a choice only when `ended`: the end token was
    written), the marks of records/marks.py, and how the response fails: the first choice after which no
    continuation reaches a goal. Forks follow `fork_positions` (same positions, same rule: nothing after the path
    leaves the graph decides); failure is "none" exactly when `path_reward` is 1."""
    n, reaching = len(response), graph.reaching()
    marks = {name: [False] * (n + 1) for name in ("forks", "decisions", "on_graph", "invalid")}
    failure, decisive = "", None
    node = None  # before the start: the one option is the start the prompt names
    for t in range(n + 1):
        options = (graph.start,) if node is None else graph.options(node)
        marks["on_graph"][t] = bool(options)  # a node without options (a dead end) leaves nothing to choose
        if node is not None:
            marks["decisions"][t] = len(options) >= 2
            marks["forks"][t] = is_fork(graph, node, reaching)
        if t == n and not ended:  # the budget ran out: no choice here
            failure = failure or ("none" if node in graph.goals else "out_of_tokens")
            break
        choice = response[t] if t < n else STOP
        if choice not in options:
            marks["invalid"][t] = bool(options)
            if not failure:
                failure, decisive = ("early_stop" if choice == STOP else "invalid_letter"), t
            break
        if choice == STOP:  # a stop at a goal
            failure = failure or "none"
            break
        if not failure and choice not in reaching:
            failure, decisive = ("wrong_branch", t) if node is not None else ("unreachable", None)
        node = choice
    return CharMarks(**marks, failure=failure, decisive=decisive)


def path_reward(response: str, answer: str) -> float:
    """1.0 when `response` is exactly a path of the graph `answer` (`Graph.encode`) from its start to a goal."""
    graph = Graph.decode(answer)
    if not response or response[0] != graph.start or response[-1] not in graph.goals:
        return 0.0
    return float(all(b in graph.successors.get(a, ()) for a, b in zip(response, response[1:])))


@dataclass(frozen=True)
class GraphShape:
    """A layered graph: `layers` layers of `width` nodes, each node outside the last layer with `branching` distinct
    successors in the next layer, and `distractors` dead ends (nodes without successors) each hanging as one more
    successor off a random node outside the last layer. Paths run from a start to a goal in the last layer: each
    decision is a fork where some successors reach the goal and some do not, free where all do (or none)."""

    width: int = 5
    layers: int = 5
    branching: int = 2
    distractors: int = 0

    def node_count(self) -> int:
        return self.width * self.layers + self.distractors

    def check(self) -> None:
        if self.width < 1 or self.layers < 2 or self.distractors < 0:
            raise ValueError(
                f"task.width={self.width} must be >= 1, task.layers={self.layers} >= 2 and "
                f"task.distractors={self.distractors} >= 0"
            )
        if not 1 <= self.branching <= self.width:
            raise ValueError(f"task.branching={self.branching} must be in [1, task.width={self.width}]")
        if self.node_count() > len(LABELS):
            raise ValueError(
                f"task.width × task.layers + task.distractors = {self.node_count()} nodes, more than the "
                f"{len(LABELS)} labels A–Z, a–z: lower task.width, layers or distractors"
            )


def layered_graph(shape: GraphShape, rng: random.Random) -> tuple[dict[str, tuple[str, ...]], list[list[str]]]:
    """(successors, layers) of a random graph of `shape`, labels and successor orders shuffled."""
    labels = iter(rng.sample(LABELS, len(LABELS)))
    layers = [[next(labels) for _ in range(shape.width)] for _ in range(shape.layers)]
    successors = {
        node: rng.sample(layers[i + 1], shape.branching) for i, layer in enumerate(layers[:-1]) for node in layer
    }
    successors.update({node: [] for node in layers[-1]})
    for _ in range(shape.distractors):
        dead_end = next(labels)
        successors[rng.choice([node for layer in layers[:-1] for node in layer])].append(dead_end)
        successors[dead_end] = []
    for succ in successors.values():
        rng.shuffle(succ)
    order = list(successors)
    rng.shuffle(order)
    return {node: tuple(successors[node]) for node in order}, layers


def reachable_goal(
    successors: dict[str, tuple[str, ...]], start: str, goals: list[str], rng: random.Random
) -> str | None:
    """A random one of `goals` that some path from `start` reaches (None if none does)."""
    reachable = [goal for goal in goals if start in Graph(successors, start, frozenset({goal})).reaching()]
    return rng.choice(reachable) if reachable else None


def random_walk(graph: Graph, rng: random.Random, max_length: int) -> str:
    """A path from the start choosing uniformly among each node's options (`Graph.options`) until it stops, reaches
    a node without options, or has `max_length` nodes: a valid walk, not necessarily one that reaches the goal."""
    walk = graph.start
    while len(walk) < max_length:
        options = graph.options(walk[-1])
        if not options:
            break
        choice = rng.choice(options)
        if choice == STOP:
            break
        walk += choice
    return walk
