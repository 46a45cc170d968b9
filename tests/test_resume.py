"""resume.py: which checkpoint a run resumes from (a .ckpt file or a sharded checkpoint's folder; never one a save
left half-written), the run folder it continues in, and the metrics rows it keeps."""
from __future__ import annotations

import csv

import pytest
import torch

from tokenrl.checkpointing import AtomicFSDPStrategy
from tokenrl.resume import checkpoint_step, kept_metric_rows, resolve_checkpoint, run_dir_override


def write_checkpoint(path, step):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(3)}, "tokenrl": {"rollout_step": step}}, path)
    return path


def test_checkpoint_step_reads_the_rollout_step(tmp_path):
    assert checkpoint_step(write_checkpoint(tmp_path / "a.ckpt", 4)) == 4
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not a tokenrl checkpoint"):
        checkpoint_step(tmp_path / "other.ckpt")


def test_resolve_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert resolve_checkpoint(None, run, 6) == (None, 0)
    assert resolve_checkpoint("auto", run, 6) == (None, 0)   # nothing yet: a fresh start
    last = write_checkpoint(run / "checkpoints" / "last.ckpt", 2)
    assert resolve_checkpoint("auto", run, 6) == (str(last), 2)
    assert resolve_checkpoint(str(last), tmp_path / "elsewhere", 6) == (str(last), 2)
    with pytest.raises(FileNotFoundError, match=r"ckpt_path=/no/such.ckpt: no such file or folder"):
        resolve_checkpoint("/no/such.ckpt", run, 6)
    with pytest.raises(ValueError, match=r"holds 2 rollout steps and total_steps=2: nothing is left to train; set "
                                         r"total_steps above 2"):
        resolve_checkpoint(str(last), run, 2)


def write_sharded(path, step):
    AtomicFSDPStrategy(state_dict_type="sharded").save_checkpoint(
        {"state_dict": {"policy.w": torch.zeros(3)}, "tokenrl": {"rollout_step": step}}, path)
    return path


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_resolve_a_sharded_checkpoint_and_never_a_half_written_one(tmp_path):
    """The step comes from a sharded folder's meta.pt; a folder without it (a save cut short) is refused by name, and
    a save's temporary folder is never taken while the checkpoint it was replacing is complete."""
    run = tmp_path / "run"
    last = write_sharded(run / "checkpoints" / "last.ckpt", 3)
    assert checkpoint_step(last) == 3
    assert resolve_checkpoint("auto", run, 6) == (str(last), 3) == resolve_checkpoint(str(last), tmp_path, 6)
    partial = run / "checkpoints" / ".last.ckpt.k2x9.tmp"   # a later save killed before its meta.pt
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"\0")
    assert resolve_checkpoint("auto", run, 6) == (str(last), 3)
    with pytest.raises(ValueError, match=r"ckpt_path=.*k2x9.tmp: a folder without meta.pt, so not a complete sharded "
                                         r"checkpoint \(a save that was cut short\?\)"):
        resolve_checkpoint(str(partial), run, 6)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_save_killed_while_swapping_its_folder_in_resumes_from_the_new_checkpoint(tmp_path):
    """Where folders cannot be exchanged in one step, the old last.ckpt is removed (meta.pt first) before the new one
    is renamed in: killed in between, `auto` and the explicit path take the complete new one."""
    checkpoints = tmp_path / "run" / "checkpoints"
    pending = write_sharded(checkpoints / ".last.ckpt.a1b2.tmp", 4)
    (checkpoints / "last.ckpt").mkdir()   # the old one, meta.pt already removed
    assert resolve_checkpoint("auto", tmp_path / "run", 6) == (str(pending), 4)
    (checkpoints / "last.ckpt").rmdir()
    assert resolve_checkpoint(str(checkpoints / "last.ckpt"), tmp_path, 6) == (str(pending), 4)


def test_run_dir_override_continues_in_the_checkpoints_run(tmp_path):
    run = tmp_path / "runs" / "t0"
    (run / ".hydra").mkdir(parents=True)
    last = write_checkpoint(run / "checkpoints" / "last.ckpt", 2)
    assert run_dir_override(["seed=1", f"ckpt_path={last}"]) == ["seed=1", f"ckpt_path={last}",
                                                                  f"hydra.run.dir={run}"]
    unchanged = [["seed=1"], [f"ckpt_path={last}", "hydra.run.dir=/x"], ["-m", f"ckpt_path={last}"],
                 ["ckpt_path=auto"], ["ckpt_path=null"]]
    for argv in unchanged:
        assert run_dir_override(argv) == argv
    loose = write_checkpoint(tmp_path / "loose.ckpt", 2)   # not inside a run folder
    assert run_dir_override([f"ckpt_path={loose}"]) == [f"ckpt_path={loose}"]


def test_kept_metric_rows_drop_the_steps_the_resume_redoes(tmp_path):
    path = tmp_path / "metrics.csv"
    rows = [{"step": 0, "val/at_step": 0.0, "val/pass@1": 0.1}, {"step": 0, "train/rollout_step": 1.0},
            {"step": 1, "train/rollout_step": 2.0}, {"step": 2, "val/at_step": 2.0, "val/pass@1": 0.2},
            {"step": 2, "train/rollout_step": 3.0}]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for row in rows for k in row}))
        writer.writeheader()
        writer.writerows(rows)
    kept = kept_metric_rows(path, steps_done=2)
    assert kept == [{"step": "0", "val/at_step": "0.0", "val/pass@1": "0.1"},
                    {"step": "0", "train/rollout_step": "1.0"}, {"step": "1", "train/rollout_step": "2.0"}]
    assert kept_metric_rows(tmp_path / "absent.csv", 2) == []
