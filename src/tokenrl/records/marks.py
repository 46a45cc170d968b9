"""What a task that names its forks says about each response (`CharMarks`, per character: data/forks_graph.py) and
the same carried to tokens (`ForkMarks`, (B, T): rollout/fork_marks.py), read by the diagnostics (observe/) and by
the selectors that use the truth (`forks_oracle`, `forks_matched_random`).

Per position t of a response (each character, and its end: the stop decision):
  on_graph  the path before t follows the graph from the start and its node has an option (a dead end, a node
            without successors that is not a goal, has none: nothing written there is a choice);
  decision  on_graph, t ≥ 1 (the start is named by the prompt) and the node before t has ≥ 2 options;
  fork      a decision with some options that can still reach a goal and some that cannot (fork ⊂ decision);
  invalid   on_graph and the choice at t is not an option of the node (a letter off the graph, or a stop at a
            non-goal): the path leaves the graph there.
A position that is on the graph and not a decision is forced (one option, none, or the start).
Per response, how it fails (`FAILURES`): the first event after which no continuation reaches a goal, and where.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# How a response fails; "none": it succeeds (path reward 1).
# wrong_branch: a valid option at a fork from which no goal is reachable (the path may stay on the graph);
# invalid_letter: a letter that is not an option; early_stop: the end token at a node that is not a goal;
# out_of_tokens: still on a winning path when the budget ends; unreachable: no goal is reachable from the start.
FAILURES = ("none", "wrong_branch", "invalid_letter", "early_stop", "out_of_tokens", "unreachable")


@dataclass(frozen=True)
class CharMarks:
    """Per character of a response and its end (lists of len(response) + 1), its failure (`FAILURES`) and the
    position where that failure was decided (None for none, out_of_tokens and unreachable)."""

    forks: list[bool]
    decisions: list[bool]
    on_graph: list[bool]
    invalid: list[bool]
    failure: str
    decisive: int | None = None

    def positions(self) -> dict[str, list[bool]]:
        """The per-position marks by name (`ForkMarks` fields), `decisive` as a one-hot list."""
        decisive = [t == self.decisive for t in range(len(self.forks))]
        return {
            "forks": self.forks,
            "decisions": self.decisions,
            "on_graph": self.on_graph,
            "invalid": self.invalid,
            "decisive": decisive,
        }


POSITION_MARKS = ("forks", "decisions", "on_graph", "invalid", "decisive")


@dataclass
class ForkMarks:
    """(B, T) booleans per response token (a token carries a mark when any character it covers does; the end token
    carries the stop decision's), and `failure` (B,) long: each row's index into `FAILURES`."""

    forks: torch.Tensor
    decisions: torch.Tensor
    on_graph: torch.Tensor
    invalid: torch.Tensor
    decisive: torch.Tensor
    failure: torch.Tensor

    def rows(self, index: torch.Tensor) -> ForkMarks:
        return ForkMarks(**{name: value[index] for name, value in vars(self).items()})

    def padded(self, width: int) -> ForkMarks:
        """The marks with T padded to `width` (no mark on the new columns)."""
        return ForkMarks(
            **{name: torch.nn.functional.pad(getattr(self, name), (0, width - self.width)) for name in POSITION_MARKS},
            failure=self.failure,
        )

    @property
    def width(self) -> int:
        return self.forks.shape[1]

    @staticmethod
    def cat(parts: list[ForkMarks], width: int) -> ForkMarks:
        """The rows of `parts` in order, padded to `width` columns."""
        padded = [part.padded(width) for part in parts]
        return ForkMarks(**{name: torch.cat([getattr(p, name) for p in padded]) for name in vars(padded[0])})
