"""`${tokenrl.run_id:}` (src/hydra_plugins/tokenrl_launcher/run_id.py): every run gets a folder of its own, also two
started in the same second, and a run or sweep resolves its folder once: Lightning's DDP ranks, the fresh-process and
SLURM launchers' jobs read the folder the launching process chose."""

from __future__ import annotations

import time

import cloudpickle
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from tests.conftest import CONFIG_DIR
from tests.helpers.forked_cli import forked_python

FROZEN = 1.8e9  # every call of time.time() in the same second
STAMP = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(FROZEN))


def composed(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def test_two_runs_started_in_the_same_second_get_their_own_folders(monkeypatch, tmp_path):
    monkeypatch.setattr(time, "time", lambda: FROZEN)
    first, second = (composed(f"paths.log_dir={tmp_path}") for _ in range(2))
    runs = [str(cfg.hydra.run.dir) for cfg in (first, second)]
    sweeps = [str(cfg.hydra.sweep.dir) for cfg in (first, second)]
    assert runs[0] != runs[1] and sweeps[0] != sweeps[1]
    assert all(run.startswith(f"{tmp_path}/train/runs/{STAMP}_") for run in runs)
    assert all(sweep.startswith(f"{tmp_path}/train/multiruns/{STAMP}_") for sweep in sweeps)


def test_a_run_resolves_its_folder_once(monkeypatch):
    """Read again, through HydraConfig (Lightning's command for DDP rank 1), after pickling (a fresh-process or SLURM
    job) and copied into a job's newly composed config (Hydra's `load_sweep_config`): always the same folder."""
    cfg = composed()
    run, sweep = str(cfg.hydra.run.dir), str(cfg.hydra.sweep.dir)
    assert str(cfg.hydra.run.dir) == run
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # restored after the test
    HydraConfig.instance().set_config(cfg)
    assert str(HydraConfig.get().run.dir) == run
    assert str(cloudpickle.loads(cloudpickle.dumps(cfg)).hydra.sweep.dir) == sweep
    job = composed("seed=1")
    OmegaConf.copy_cache(from_config=cloudpickle.loads(cloudpickle.dumps(cfg)), to_config=job)
    assert str(job.hydra.sweep.dir) == sweep


@pytest.mark.slow
def test_two_train_py_runs_in_the_same_second_write_two_folders(tmp_path):
    """`python train.py` twice with the clock frozen at one second: two run folders, each with its own train.log (a
    task file that does not exist ends each run right after Hydra made its folder; settings the start-up check refuses
    would end it before any folder)."""
    frozen = (
        "import runpy, sys, time\n"
        f"time.time = lambda: {FROZEN}\n"
        "sys.argv = ['train.py', *sys.argv[1:]]\n"
        "runpy.run_path('train.py', run_name='__main__')\n"
    )
    for _ in range(2):
        source = f"task.source={tmp_path}/absent/*.jsonl"
        done = forked_python(["-c", frozen, "debug=default", "task=dataset", source, f"paths.log_dir={tmp_path}"])
        assert done.returncode == 2 and "the glob matches no file" in done.stderr, done.stderr[-2000:]
    runs = sorted((tmp_path / "train" / "runs").iterdir())
    assert len(runs) == 2 and all(run.name.startswith(f"{STAMP}_") for run in runs)
    assert all("the glob matches no file" in (run / "train.log").read_text() for run in runs)
