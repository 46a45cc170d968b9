"""Training tasks: where problems come from, the instruction appended to each question, and the verifier.

`arithmetic` is the offline default (procedural, seeded); `gsm8k` reads the official JSONL files.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from pathlib import Path

from tokenrl.data.records import DataFormatError, Problem, read_jsonl


class Task(ABC):
    """A source of train/test problems with one answer format."""

    def __init__(self, instruction: str, verifier: str, max_new_tokens: int) -> None:
        self.instruction = instruction
        self.verifier = verifier
        self.max_new_tokens = max_new_tokens

    @abstractmethod
    def problems(self, split: str) -> list[Problem]:
        """All problems of `split` ('train' or 'test')."""

    def question_text(self, problem: Problem) -> str:
        return f"{problem.question} {self.instruction}".strip()


class ArithmeticTask(Task):
    """Procedural `a op b` problems with operands in [low, high]; train and test drawn from disjoint seeds."""

    def __init__(self, low: int, high: int, ops: list[str], train_size: int, test_size: int, seed: int,
                 instruction: str, verifier: str, max_new_tokens: int = 32) -> None:
        super().__init__(instruction, verifier, max_new_tokens)
        bad = sorted(set(ops) - {"+", "-", "*"})
        if bad:
            raise ValueError(f"task.ops has {bad}; allowed: '+', '-', '*'")
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


class GSM8KTask(Task):
    """GSM8K from `data_dir/gsm8k/{train,test}.jsonl`; the answer is the text after '#### ' (commas removed)."""

    def __init__(self, data_dir: str, instruction: str, verifier: str, max_new_tokens: int = 1024,
                 limit: int | None = None) -> None:
        super().__init__(instruction, verifier, max_new_tokens)
        self.data_dir = Path(data_dir).expanduser()
        self.limit = limit

    def problems(self, split: str) -> list[Problem]:
        path = self.data_dir / "gsm8k" / f"{split}.jsonl"
        out = []
        for lineno, row in read_jsonl(path, ("question", "answer")):
            if "####" not in row["answer"]:
                raise DataFormatError(f"{path}:{lineno}: field 'answer' has no '#### <number>' final answer")
            final = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
            out.append(Problem(f"gsm8k-{split}-{lineno}", row["question"], final, self.verifier))
            if self.limit and len(out) >= self.limit:
                break
        return out
