"""Small shared helpers: derived seeds and a step timer."""
from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


def derived_seed(*parts: object) -> int:
    """A 31-bit seed that depends only on `parts` (stable across processes and Python versions)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class StepTimer:
    """Wall-clock seconds per named phase of one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start
