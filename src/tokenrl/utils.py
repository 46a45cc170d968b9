"""Small shared helpers: derived seeds, a step timer (with peak GPU memory per phase), the process's RNG states (what
a checkpoint carries), and keeping the process's global torch state across a library call that changes it."""

from __future__ import annotations

import hashlib
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """torch's, NumPy's and Python's RNG states in plain types (checkpoints load with torch.load(weights_only=True))."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # numpy's stub: a dict; legacy=True gives this tuple
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),  # type: ignore[attr-defined]
        "python": random.getstate(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


@contextmanager
def global_state_kept() -> Iterator[None]:
    """Restores, after the block, what the trainer relies on and a library may change: the RNG states (`rng_state`,
    and every initialised GPU's), float32 matmul precision and torch's thread count. vLLM seeds torch's, NumPy's and
    Python's RNGs with its engine seed and may set the precision and threads when an engine starts."""
    states = rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    precision, threads = torch.get_float32_matmul_precision(), torch.get_num_threads()
    try:
        yield
    finally:
        restore_rng_state(states)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_float32_matmul_precision(precision)
        torch.set_num_threads(threads)


def derived_seed(*parts: object) -> int:
    """A 31-bit seed that depends only on `parts` (stable across processes and Python versions)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class StepTimer:
    """Wall-clock seconds per named phase of one step and, on a GPU, the peak memory PyTorch allocated in each
    (GiB; the device is synchronised at both ends so asynchronous kernels are counted in their phase). Each phase is
    a `phase/<name>` range in a torch profile (scripts/bench/profile_step.py)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_gib: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"phase/{phase}"):  # the phase's range in a profile
                yield
        finally:
            if on_gpu:
                torch.cuda.synchronize()
                self.peak_gib[phase] = max(self.peak_gib[phase], torch.cuda.max_memory_allocated() / 2**30)
            self.seconds[phase] += time.perf_counter() - start


def as_dict(node: Any, *, resolve: bool = True) -> dict[str, Any]:
    """`OmegaConf.to_container(node)` of a mapping node (its keys as strings), its interpolations resolved unless
    `resolve=False`; TypeError for a node that is not a mapping."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a config mapping, got {type(plain).__name__}: {plain!r}")
    return {str(key): value for key, value in plain.items()}
