"""run/checkpointing.py: a failed save names the file, the space it needs and that the previous checkpoint is intact;
the temporaries of a killed save are removed; a sharded checkpoint's folder is replaced whole (a kill at any point
leaves the previous one or the new one complete); the policy's weights are read from either kind; a run's last.ckpt is
its newest step file under a second name, `checkpoint.keep_last_k` bounds the step files, and a checkpoint holds each
weight once. The same under 2 real FSDP ranks: tests/step/test_distributed.py (resume from sharded and full
checkpoints)."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
import torch

import tokenrl.run.checkpointing as checkpointing
from tests.conftest import TINY, compose_config
from tests.helpers.tiny import tiny_policy
from tokenrl.run.checkpointing import (
    TEMPORARY_GLOB,
    AtomicCheckpointIO,
    AtomicFSDPStrategy,
    CheckpointWriteError,
    interrupted_swap,
    is_sharded_checkpoint,
    policy_state_dict,
    remove_stale_temporaries,
)
from tokenrl.run.training import run

# a sharded save in one process (no process group) is what torch.distributed.checkpoint warns about
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class FullDisk(io.RawIOBase):
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return len(data)


def test_a_full_disk_names_the_file_the_size_and_the_intact_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    io_plugin = AtomicCheckpointIO()
    io_plugin.save_checkpoint({"state_dict": {"w": torch.zeros(4)}}, target)  # the previous checkpoint
    real_save = torch.save
    monkeypatch.setattr(checkpointing.torch, "save", lambda obj, handle: real_save(obj, FullDisk(room=4096)))
    with pytest.raises(CheckpointWriteError) as caught:
        io_plugin.save_checkpoint({"state_dict": {"w": torch.zeros(2**20)}}, target)  # 4 MiB of fp32
    message = str(caught.value)
    assert f"no space left on device writing checkpoint {target}" in message
    assert "it needs about 0.00 GiB" in message and "GiB free" in message  # 4 MiB = 0.004 GiB
    assert "the previous last.ckpt is intact" in message
    assert torch.load(target, weights_only=True)["state_dict"]["w"].shape == (4,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no partial file left


def test_other_write_errors_name_the_file(tmp_path, monkeypatch):
    def refuse(obj, handle):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpointing.torch, "save", refuse)
    with pytest.raises(
        CheckpointWriteError,
        match=r"could not write checkpoint .*step0002.ckpt: .*Permission denied; "
        r"no step0002.ckpt was written before",
    ):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "step0002.ckpt")


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path):
    (tmp_path / ".last.ckpt.abc123.tmp").write_bytes(b"\0" * 10)
    (tmp_path / ".step0003.ckpt.x9.tmp").write_bytes(b"\0")
    (tmp_path / ".step0004.ckpt.k2.tmp").mkdir()  # a sharded save's folder, cut short
    (tmp_path / ".step0004.ckpt.k2.tmp" / "__0_0.distcp").write_bytes(b"\0")
    (tmp_path / "last.ckpt").write_bytes(b"kept")
    (tmp_path / "notes.tmp").write_bytes(b"kept")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [
        ".last.ckpt.abc123.tmp",
        ".step0003.ckpt.x9.tmp",
        ".step0004.ckpt.k2.tmp",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "notes.tmp"]
    assert remove_stale_temporaries(tmp_path / "absent") == []


# --------------------------------------------------------------------------- sharded checkpoints (one process)
def sharded_state(step: int, weight: float) -> dict:
    """What Lightning hands FSDPStrategy.save_checkpoint: the module's and the optimizer's states and the rest."""
    return {
        "state_dict": {"policy.w": torch.full((4,), weight), "policy.b": torch.zeros(2)},
        "optimizer_states": [{"state": {0: {"exp_avg": torch.ones(4)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
        "tokenrl": {"rollout_step": step},
    }


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2_exchange", "remove_then_rename"])
def test_a_sharded_checkpoint_replaces_the_previous_folder_whole(tmp_path, monkeypatch, exchange):
    """The shards and meta.pt go to a temporary folder that replaces the target once complete: exchanged in one step
    where the file system can, else the old one removed and the new renamed in (NFS)."""
    if not exchange:
        monkeypatch.setattr(checkpointing, "_exchange", lambda a, b: False)
    strategy, target = AtomicFSDPStrategy(state_dict_type="sharded"), tmp_path / "last.ckpt"
    strategy.save_checkpoint(sharded_state(1, 1.0), target)
    strategy.save_checkpoint(sharded_state(2, 2.0), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"] and is_sharded_checkpoint(target)
    assert sorted(p.name for p in target.iterdir()) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert torch.load(target / "meta.pt", weights_only=True) == {"tokenrl": {"rollout_step": 2}}
    policy = policy_state_dict(target)
    assert sorted(policy) == ["b", "w"] and torch.equal(policy["w"], torch.full((4,), 2.0))


def test_superseded_checkpoints_are_removed_files_and_folders(tmp_path):
    """What ModelCheckpoint drops (an older stepNNNN.ckpt) goes through the IO plugin: a folder loses meta.pt first."""
    AtomicFSDPStrategy(state_dict_type="sharded").save_checkpoint(sharded_state(1, 1.0), tmp_path / "step0001.ckpt")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, tmp_path / "step0002.ckpt")
    for name in ("step0001.ckpt", "step0002.ckpt"):
        AtomicCheckpointIO().remove_checkpoint(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_resuming_a_sharded_checkpoint_without_fsdp_names_the_fix(tmp_path):
    """Every strategy but FSDP loads through the IO plugin, which would fail on a folder with IsADirectoryError."""
    AtomicFSDPStrategy(state_dict_type="sharded").save_checkpoint(sharded_state(1, 1.0), tmp_path / "last.ckpt")
    with pytest.raises(
        ValueError,
        match=r"last.ckpt is a sharded checkpoint \(trainer=fsdp's folder of shards\): "
        r"resume it with trainer=fsdp",
    ):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "last.ckpt")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(1)}}, tmp_path / "full.ckpt")
    assert AtomicCheckpointIO().load_checkpoint(tmp_path / "full.ckpt")["state_dict"]["w"].item() == 1.0


def test_a_sharded_checkpoint_replaces_a_full_one_of_the_same_name(tmp_path):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"policy.w": torch.zeros(4)}}, target)
    AtomicFSDPStrategy(state_dict_type="sharded").save_checkpoint(sharded_state(3, 3.0), target)
    assert is_sharded_checkpoint(target) and torch.equal(policy_state_dict(target)["w"], torch.full((4,), 3.0))


@pytest.mark.parametrize(
    "failure,message",
    [
        (
            OSError(errno.ENOSPC, "No space left on device"),
            r"no space left on device writing checkpoint .*last.ckpt: it "
            r"needs about 0.00 GiB per rank .* GiB free",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied"),
            r"could not write checkpoint .*last.ckpt: rank 1: "
            r"PermissionError: .*Permission denied",
        ),
    ],
)
def test_a_failed_sharded_save_names_the_cause_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, failure, message
):
    """A rank's failure reaches every rank as torch.distributed.checkpoint's CheckpointException; the partial folder
    is removed, the previous checkpoint is intact."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    strategy, target = AtomicFSDPStrategy(state_dict_type="sharded"), tmp_path / "last.ckpt"
    strategy.save_checkpoint(sharded_state(1, 1.0), target)

    def failing(state, checkpoint_id):
        (checkpoint_id / "__0_0.distcp").write_bytes(b"\0" * 100)  # rank 0's half-written shard
        raise CheckpointException("save", {1: (failure, None)})

    monkeypatch.setattr(dcp, "save", failing)
    with pytest.raises(CheckpointWriteError, match=message + r".*; the previous last.ckpt is intact"):
        strategy.save_checkpoint(sharded_state(2, 2.0), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.equal(policy_state_dict(target)["w"], torch.full((4,), 1.0))


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt  # a save that never finishes (kill -9, a node failure): nothing is cleaned up


def test_a_sharded_save_killed_midway_leaves_the_previous_checkpoint_and_a_temporary_that_is_removed(
    tmp_path, monkeypatch
):
    strategy, target = AtomicFSDPStrategy(state_dict_type="sharded"), tmp_path / "last.ckpt"
    strategy.save_checkpoint(sharded_state(1, 1.0), target)
    monkeypatch.setattr(checkpointing, "_save_atomically", interrupt)  # the shards are written, meta.pt is not
    with pytest.raises(KeyboardInterrupt):
        strategy.save_checkpoint(sharded_state(2, 2.0), target)
    (partial,) = tmp_path.glob(TEMPORARY_GLOB)
    assert (partial / "__0_0.distcp").is_file() and not is_sharded_checkpoint(partial)
    assert interrupted_swap(target) is None and torch.equal(policy_state_dict(target)["w"], torch.full((4,), 1.0))
    assert remove_stale_temporaries(tmp_path) == [partial]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_swap_killed_between_its_renames_leaves_the_new_checkpoint_complete_for_resume(tmp_path, monkeypatch):
    """Without an atomic exchange the old folder is removed, then the new one renamed in: killed in between, the new
    checkpoint is complete under its temporary name; resume takes it (`interrupted_swap`) and clean-up keeps it."""
    strategy, target = AtomicFSDPStrategy(state_dict_type="sharded"), tmp_path / "last.ckpt"
    strategy.save_checkpoint(sharded_state(1, 1.0), target)
    real_remove = checkpointing._remove

    def remove_then_die(path):
        real_remove(path)
        interrupt()

    monkeypatch.setattr(checkpointing, "_exchange", lambda a, b: False)
    monkeypatch.setattr(checkpointing, "_remove", remove_then_die)
    with pytest.raises(KeyboardInterrupt):
        strategy.save_checkpoint(sharded_state(2, 2.0), target)
    (pending,) = tmp_path.glob(TEMPORARY_GLOB)
    assert not target.exists() and interrupted_swap(target) == pending
    assert remove_stale_temporaries(tmp_path) == [] and pending.is_dir()
    assert torch.equal(policy_state_dict(pending)["w"], torch.full((4,), 2.0))


def test_policy_state_dict_reads_a_full_checkpoint_and_names_what_is_wrong(tmp_path):
    AtomicCheckpointIO().save_checkpoint(
        {"state_dict": {"policy.w": torch.ones(3), "other.x": torch.ones(1)}}, tmp_path / "a.ckpt"
    )
    assert list(policy_state_dict(tmp_path / "a.ckpt")) == ["w"]
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"other.x": torch.ones(1)}}, tmp_path / "b.ckpt")
    with pytest.raises(ValueError, match=r"b.ckpt holds no `policy.\*` weights"):
        policy_state_dict(tmp_path / "b.ckpt")
    with pytest.raises(
        FileNotFoundError,
        match=r"no checkpoint at .*absent.ckpt: a tokenrl checkpoint is a .ckpt file "
        r"or a sharded checkpoint's folder holding meta.pt",
    ):
        policy_state_dict(tmp_path / "absent.ckpt")


# --------------------------------------------------------------------------- a run's checkpoints: each state once
@pytest.fixture(scope="module")
def four_steps(tmp_path_factory) -> Path:
    """The checkpoints folder of a 4-step tiny run saving every step, keeping 2, its best the first step's (the least
    train/rollout_step)."""
    out = tmp_path_factory.mktemp("four_steps")
    saving = ["checkpoint.enabled=true", "checkpoint.every_n_steps=1", "checkpoint.keep_last_k=2"]
    best_first = ["checkpoint.monitor=train/rollout_step", "checkpoint.mode=min"]
    run(compose_config([*TINY, "total_steps=4", *saving, *best_first, "export.enabled=false"], output_dir=out))
    return out / "checkpoints"


def test_last_ckpt_is_the_newest_step_file_and_keep_last_k_bounds_the_step_files(four_steps):
    kept = ["last.ckpt", "step0001.ckpt", "step0003.ckpt", "step0004.ckpt"]  # the newest 2, the best, last
    assert sorted(p.name for p in four_steps.iterdir()) == kept
    assert os.path.samefile(four_steps / "last.ckpt", four_steps / "step0004.ckpt")  # one file, two names
    assert torch.load(four_steps / "last.ckpt", weights_only=True)["tokenrl"]["rollout_step"] == 4


def test_a_checkpoint_holds_each_weight_once(four_steps):
    """The policy's weights (not the frozen KL reference, rebuilt from model.* on resume; the tied lm_head in its
    embedding's storage) and AdamW's two moments of each: the file is that, and a few KB of state."""
    checkpoint = torch.load(four_steps / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["tokenrl_config"]["algorithm"]["kl_coef"] > 0  # the run has a reference model
    policy, _ = tiny_policy()
    assert set(checkpoint["state_dict"]) == {f"policy.{name}" for name in policy.state_dict()}

    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (dict, list, tuple)):
            for item in value.values() if isinstance(value, dict) else value:
                yield from tensors(item)

    stored = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors(checkpoint)}
    weights = sum(p.numel() * p.element_size() for p in policy.parameters())  # a tied weight counts once
    assert 3 * weights <= sum(stored.values()) < 3 * weights + 16384
    assert os.path.getsize(four_steps / "last.ckpt") < 1.1 * sum(stored.values())


def test_a_second_name_replaces_the_previous_in_one_step_and_keeps_its_state(tmp_path, monkeypatch):
    """last.ckpt becomes a hard link of a step file (linking it again changes nothing and leaves no temporary); a later
    save of the step file's name replaces it, so last.ckpt keeps its state; without hard links, a copy."""
    io_plugin, last, step = AtomicCheckpointIO(), tmp_path / "last.ckpt", tmp_path / "step0002.ckpt"
    io_plugin.save_checkpoint({"tokenrl": {"rollout_step": 1}}, last)  # the previous last.ckpt, a file of its own
    io_plugin.save_checkpoint({"tokenrl": {"rollout_step": 2}}, step)
    for _ in range(2):
        checkpointing._link_atomically(step, last)
    assert os.path.samefile(last, step) and sorted(p.name for p in tmp_path.iterdir()) == [last.name, step.name]
    io_plugin.save_checkpoint({"tokenrl": {"rollout_step": 3}}, step)
    assert torch.load(last, weights_only=True)["tokenrl"]["rollout_step"] == 2

    def no_hard_links(source, name):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(checkpointing.os, "link", no_hard_links)
    checkpointing._link_atomically(step, last)
    assert not os.path.samefile(last, step) and torch.load(last, weights_only=True)["tokenrl"]["rollout_step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [last.name, step.name]


def test_a_sharded_step_folder_gets_its_second_name_file_by_file(tmp_path):
    strategy, last, step = AtomicFSDPStrategy(state_dict_type="sharded"), tmp_path / "last.ckpt", tmp_path / "step2"
    strategy.save_checkpoint(sharded_state(1, 1.0), last)
    strategy.save_checkpoint(sharded_state(2, 2.0), step)
    checkpointing._link_atomically(step, last)
    assert is_sharded_checkpoint(last) and sorted(p.name for p in tmp_path.iterdir()) == [last.name, step.name]
    assert all(os.path.samefile(part, last / part.name) for part in step.iterdir())
    assert torch.equal(policy_state_dict(last)["w"], torch.full((4,), 2.0))
