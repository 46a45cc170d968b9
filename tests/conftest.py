"""Shared fixtures: compose the real train.yaml with Hydra and shrink it for CPU tests."""

from __future__ import annotations

import copy
import fcntl
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict

from tokenrl.run.allocator import with_tcmalloc

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "configs")
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("TOKENRL_ROOT", str(ROOT))
# The benchmark files of the offline route (paths.data_dir reads the same variable). A fresh clone has none: the tests
# marked `data` skip without them, and .ci/run runs them (`-m data`) in a pass of their own with TOKENRL_DATA_DIR set.
DATA_DIR = os.environ.get("TOKENRL_DATA_DIR") or None
needs_data = pytest.mark.data


def compose_config(overrides: list[str] | None = None, output_dir: Path | None = None) -> DictConfig:
    """The composed train config with the given overrides; outputs go to `output_dir` (not Hydra's run dir). Each
    distinct override list is composed once per session (~0.2 s each, thousands of calls) and handed out as a copy."""
    key = tuple(overrides or [])
    if key not in _COMPOSED:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            _COMPOSED[key] = compose(config_name="train", overrides=list(key))
    cfg = copy.deepcopy(_COMPOSED[key])
    with open_dict(cfg):
        if not any(o.startswith("paths.output_dir=") for o in key):
            cfg.paths.output_dir = str(output_dir or ROOT / "logs" / "tests")
    return cfg


_COMPOSED: dict[tuple[str, ...], DictConfig] = {}


def once_per_run(tmp_path_factory, worker_id: str, name: str, compute: Callable[[Path], Any]) -> Any:
    """`compute(folder)`, computed once per test run however the xdist workers split the tests that need it (a
    module's tests can run on both): the first worker to ask computes it in the run's shared folder behind a file lock
    and saves it; the others wait for the lock and read it back."""
    import torch

    if worker_id == "master":  # no xdist: this session's own folder
        return compute(tmp_path_factory.mktemp(name))
    folder = tmp_path_factory.getbasetemp().parent / name  # the run's folder, shared by its workers
    saved = folder / "once_per_run.pt"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.is_file():
            folder.mkdir(exist_ok=True)
            torch.save(compute(folder), saved)
        return torch.load(saved, weights_only=False)


TINY = [
    "model=tiny",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "rollout.max_new_tokens=12",
    "checkpoint.enabled=false",
    "reward_timeout_s=20",
    "validation.every_n_steps=0",
]


@pytest.fixture
def tiny_cfg(tmp_path):
    """A factory: tiny random Qwen2, no loggers, no checkpoints, outputs under tmp_path."""

    def make(*overrides: str) -> DictConfig:
        return compose_config(TINY + list(overrides), output_dir=tmp_path)

    return make


@pytest.fixture(scope="module")
def exact_norm():
    """RMSNorm (Qwen2's and Llama's) in the input's dtype for a module's tests: transformers' casts to float32, so a
    float64 model would be only float32-accurate there; everything else stays the real transformers model."""
    import torch
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    with pytest.MonkeyPatch.context() as patch:
        for norm in (modeling_qwen2.Qwen2RMSNorm, modeling_llama.LlamaRMSNorm):
            patch.setattr(norm, "forward", forward)
        yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny tensors: a second thread only waits on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config) -> None:
    """Every process of the run has tcmalloc preloaded, as `train.py` re-executes itself to have it (the xdist
    workers start after this hook and inherit it): tests run on the allocator users' runs run on (~10% faster here),
    and a CLI run forked from an imported process (tests/helpers/forked_cli.py) does not re-execute into a fresh
    start-up. Under xdist each worker takes its share of the cores for its own tensors (not every core each), and so
    do the fresh processes its tests start (a DDP rank, a sweep's job: `OMP_NUM_THREADS`), which would otherwise each
    take every core and thrash beside the other workers."""
    preloaded = with_tcmalloc(os.environ)
    if preloaded is not None:
        os.environ["LD_PRELOAD"] = preloaded["LD_PRELOAD"]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        share = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


# The modules of the longest tests (a minute or so each), longest first.
LONGEST_FIRST = (
    "test_fresh_process_launcher.py",
    "test_bench_gpu_step.py",
    "test_vllm_engine.py",
    "test_distributed.py",
    "test_doctor.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Modules with slow tests run first, those of `LONGEST_FIRST` in its order, each module's tests together and in
    their order (a module fixture is built once per worker): xdist's workers take tests from the front of their queues
    and steal from the back, so a run ends on quick tests, not with one worker finishing a long test alone (~80 s
    here). Without the benchmark files, the tests marked `data` skip, saying so."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        if item.path.name in LONGEST_FIRST:
            return LONGEST_FIRST.index(item.path.name)
        return len(LONGEST_FIRST) + (item.path not in slow)

    items.sort(key=rank)
    if DATA_DIR is None:
        skip = pytest.mark.skip(reason="needs the benchmark files: set TOKENRL_DATA_DIR to the folder that holds them")
        for item in items:
            if item.get_closest_marker("data"):
                item.add_marker(skip)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (setup.cfg): one worker per core, at most 4 (a worker may start a vLLM engine or two DDP ranks, each
    a few GiB)."""
    return min(len(os.sched_getaffinity(0)), 4)
