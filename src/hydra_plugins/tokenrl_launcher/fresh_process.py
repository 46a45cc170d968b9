"""Run each job of a Hydra multirun in a new process, `n_jobs` at a time, in Hydra's multirun folder layout
(docs/sweeps.md). Why: an in-process vLLM engine never gives all of its memory back (vllm#21073) and sleep mode allows
one engine per process, while Hydra's basic launcher runs every job in the launching process (and joblib's workers are
reused). Each job goes through Hydra's own `run_job`, so its folder, `.hydra/`, logging and return are the basic
launcher's. Parallel slots share neither GPUs nor cores (`slot_devices`, `slot_threads`); a job whose launcher dies
gets SIGTERM, so that the run's preemption handling stops it (a pool worker would run its job to the end unwatched).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)
ORPHAN_POLL_S = 1.0


def _run_one_job(payload: bytes) -> bytes:
    """In the fresh process: restore Hydra's global state and run one job as Hydra's launchers do. Both ways go through
    cloudpickle: pickle refuses the decorated task function and the config classes Hydra re-imports (`JobReturn`)."""
    index, overrides, hydra_context, config, task_function, singleton_state = cloudpickle.loads(payload)
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{index}"
        sweep_config.hydra.job.num = index
        # Lightning's DDP launcher starts ranks 1.. as `sys.argv hydra.run.dir=<hydra.run.dir>`: make that this job's
        # overrides and folder, not the inherited sweep command line (`-m`, the lists: the whole sweep in every rank)
        sweep_config.hydra.run.dir = str(Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir))
    sys.argv = [sys.argv[0], *overrides]
    HydraConfig.instance().set_config(sweep_config)
    return cloudpickle.dumps(
        run_job(
            hydra_context=hydra_context,
            config=sweep_config,
            task_function=task_function,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    )


def _watch_launcher(launcher_pid: int) -> None:
    """SIGTERM to this job's process once the launcher that spawned it has gone (it is re-parented)."""
    while os.getppid() == launcher_pid:
        time.sleep(ORPHAN_POLL_S)
    log.warning("the sweep's launcher (pid %d) is gone: stopping this job", launcher_pid)
    os.kill(os.getpid(), signal.SIGTERM)


def _prepare_job_process(values: dict[str, str]) -> None:
    """In the spawned process, before anything initialises CUDA: the slot's environment, and the launcher watch."""
    os.environ.update(values)
    threading.Thread(target=_watch_launcher, args=(os.getppid(),), name="launcher-watch", daemon=True).start()


def _in_fresh_process(payload: bytes, environment: dict[str, str]) -> JobReturn:
    """One job in a newly spawned process that exits after it (spawn: never fork a parent holding CUDA state)."""
    with ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_prepare_job_process,
        initargs=(environment,),
    ) as process:
        return cloudpickle.loads(process.submit(_run_one_job, payload).result())


def visible_gpus() -> list[str]:
    """The GPUs this process may use: `CUDA_VISIBLE_DEVICES` when set, else every device torch counts (none on CPU)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def slot_devices(n_jobs: int, gpus_per_job: int, visible: list[str]) -> list[dict[str, str]]:
    """The environment of each parallel slot: its own `gpus_per_job` GPUs of `visible` (none set without GPUs)."""
    if gpus_per_job < 1 or not visible:
        return [{} for _ in range(n_jobs)]
    if n_jobs * gpus_per_job > len(visible):
        raise ValueError(
            f"hydra.launcher.n_jobs={n_jobs} × gpus_per_job={gpus_per_job} needs {n_jobs * gpus_per_job} "
            f"GPUs and {len(visible)} are visible ({','.join(visible)}); lower n_jobs"
        )
    return [
        {"CUDA_VISIBLE_DEVICES": ",".join(visible[slot * gpus_per_job : (slot + 1) * gpus_per_job])}
        for slot in range(n_jobs)
    ]


def slot_threads(n_jobs: int, cores: int, environ: dict[str, str]) -> dict[str, str]:
    """Each parallel slot's OpenMP threads, ⌊cores / n_jobs⌋ (at least 1); none for one job or if `environ` has them."""
    if n_jobs < 2 or "OMP_NUM_THREADS" in environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores // n_jobs))}


class FreshProcessLauncher(Launcher):
    """Up to `n_jobs` jobs at a time, each in a spawned process used for that job only."""

    def __init__(self, n_jobs: int = 1, gpus_per_job: int = 0) -> None:
        if int(n_jobs) < 1:
            raise ValueError(f"hydra.launcher.n_jobs={n_jobs} must be >= 1")
        self.n_jobs, self.gpus_per_job = int(n_jobs), int(gpus_per_job)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(
            "Launching %d jobs, %d at a time, each in a fresh process; sweep output dir: %s",
            len(job_overrides),
            self.n_jobs,
            sweep_dir,
        )
        shared = (self.hydra_context, self.config, self.task_function, Singleton.get_state())
        payloads = []
        for offset, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + offset, " ".join(filter_overrides(overrides)))
            payloads.append(cloudpickle.dumps((initial_job_idx + offset, list(overrides), *shared)))
        free: queue.Queue[dict[str, str]] = queue.Queue()
        threads = slot_threads(self.n_jobs, len(os.sched_getaffinity(0)), dict(os.environ))
        for environment in slot_devices(self.n_jobs, self.gpus_per_job, visible_gpus()):
            free.put({**threads, **environment})

        def in_a_slot(payload: bytes) -> JobReturn:
            environment = free.get()
            try:
                return _in_fresh_process(payload, environment)
            finally:
                free.put(environment)

        with ThreadPoolExecutor(max_workers=self.n_jobs) as slots:
            futures = [slots.submit(in_a_slot, payload) for payload in payloads]
            returns: list[Any] = []
            for offset, (future, overrides) in enumerate(zip(futures, job_overrides)):
                try:
                    returns.append(future.result())
                except BrokenProcessPool as err:  # its process died without reporting (killed for memory, a crash)
                    failed = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
                    failed._return_value = RuntimeError(
                        f"sweep job #{initial_job_idx + offset} ({' '.join(overrides)}) died without finishing: "
                        f"{type(err).__name__}: {err}"
                    )
                    returns.append(failed)
        return returns
