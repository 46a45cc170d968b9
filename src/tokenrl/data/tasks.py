"""Training tasks: where problems come from, the instruction appended to each question, and the verifier. `arithmetic`
is the offline default (procedural, seeded); `BenchmarkTask` trains on a benchmark split (GSM8K, MATH) from the Hub or
the local data folder; `DatasetTask` (data/dataset_task.py) on any dataset."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from tokenrl.data.benchmarks import BENCHMARKS, benchmark
from tokenrl.data.prompts import with_instruction
from tokenrl.records.marks import CharMarks
from tokenrl.records.problem import Problem
from tokenrl.records.rules import FREE_TEXT, Configurable, Rule, integer, list_of, one_of, optional
from tokenrl.records.settings import WarmupSettings
from tokenrl.rewards.verifiers import VERIFIERS, resolve


def _resolves(name: Any) -> bool:
    try:
        resolve(name)
    except (KeyError, ImportError, AttributeError, ValueError):
        return False
    return True


VERIFIER = Rule(
    lambda v: isinstance(v, str) and _resolves(v),
    f"a verifier: one of {', '.join(sorted(VERIFIERS))}, or an importable package.module:function",
)
BENCHMARK = one_of(*BENCHMARKS)


class Task(Configurable, ABC):
    """A source of train/test problems with one answer format."""

    config_node = "task"
    config_rules: ClassVar[dict[str, Rule]] = {
        "instruction": FREE_TEXT,
        "system_prompt": FREE_TEXT,
        "verifier": VERIFIER,
        "max_new_tokens": integer(1),
    }

    def __init__(
        self, instruction: str, verifier: str | None, max_new_tokens: int, system_prompt: str | None = None
    ) -> None:
        self.instruction = instruction
        self.verifier = verifier
        self.max_new_tokens = max_new_tokens
        self.system_prompt = system_prompt  # training and validation prompts start with it (data/prompts.py)
        self.warmup: WarmupSettings | None = None  # a random policy's supervised warm-up (models/warmup.py)

    @abstractmethod
    def problems(self, split: str) -> list[Problem]:
        """All problems of `split` ('train' or 'test')."""

    def question_text(self, problem: Problem) -> str:
        return with_instruction(problem.question, self.instruction)

    def forks_of(self, problem: Problem, response: str, ended: bool = True) -> CharMarks | None:
        """The forks, decisions and failure of `response` and its end (`ended`: the end token was written) as
        records/marks.py marks them; None where the task cannot name its forks (task=forks can: data/forks.py)."""
        return None

    def warmup_example(self, rng: random.Random) -> tuple[str, str]:
        """(question, response) of one example of the task's `warmup` (models/warmup.py): a task with one defines it."""
        raise NotImplementedError(f"{type(self).__name__} has no warm-up")

    def description(self) -> dict[str, Any]:
        """What determines the problems (the warm-up's cache key): a task with a `warmup` defines it."""
        raise NotImplementedError(f"{type(self).__name__} has no warm-up")


class ArithmeticTask(Task):
    """Procedural `a op b` problems with operands in [low, high]; train and test drawn from disjoint seeds."""

    verifier: str  # set: only a benchmark's may be null (its own)
    config_rules = {
        **Task.config_rules,
        "low": integer(),
        "high": integer(),
        "ops": list_of(one_of("+", "-", "*")),
        "train_size": integer(1),
        "test_size": integer(1),
        "seed": integer(0),
    }

    def __init__(
        self,
        low: int,
        high: int,
        ops: list[str],
        train_size: int,
        test_size: int,
        seed: int,
        instruction: str,
        verifier: str,
        max_new_tokens: int = 32,
    ) -> None:
        super().__init__(instruction, verifier, max_new_tokens)
        if low > high:
            raise ValueError(f"task.low={low} > task.high={high}")
        self.low, self.high, self.ops = low, high, list(ops)
        self.sizes = {"train": train_size, "test": test_size}
        self.seed = seed

    def problems(self, split: str) -> list[Problem]:
        rng = random.Random(f"{self.seed}-{split}")
        out = []
        for i in range(self.sizes[split]):
            a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
            op = rng.choice(self.ops)
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            out.append(Problem(f"{split}-{i}", f"What is {a} {op} {b}?", str(value), self.verifier))
        return out


class BenchmarkTask(Task):
    """Train on one benchmark split and validate on another (data/benchmarks.py): gsm8k = gsm8k_train / gsm8k, math =
    math_train / math500. `instruction`/`verifier` null keep the benchmark's."""

    config_rules = {
        **Task.config_rules,
        "data_dir": FREE_TEXT,
        "train": BENCHMARK,
        "test": BENCHMARK,
        "verifier": optional(VERIFIER, "the benchmark's"),
        "limit": optional(integer(1), "all"),
    }

    def __init__(
        self,
        data_dir: str | None,
        train: str,
        test: str,
        instruction: str | None = None,
        verifier: str | None = None,
        max_new_tokens: int = 1024,
        limit: int | None = None,
    ) -> None:
        self.splits = {"train": benchmark(train), "test": benchmark(test)}
        super().__init__(instruction or self.splits["train"].instruction, verifier, max_new_tokens)
        self.data_dir = data_dir
        self.limit = limit

    def problems(self, split: str) -> list[Problem]:
        return self.splits[split].load(self.data_dir, self.verifier)[: self.limit or None]
