"""checkpointing.py: a failed save names the file, the space it needs and that the previous checkpoint is intact;
the temporaries of a killed save are removed."""
from __future__ import annotations

import errno
import io

import pytest
import torch

import tokenrl.checkpointing as checkpointing
from tokenrl.checkpointing import AtomicCheckpointIO, CheckpointWriteError, remove_stale_temporaries


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
    io_plugin.save_checkpoint({"state_dict": {"w": torch.zeros(4)}}, target)   # the previous checkpoint
    real_save = torch.save
    monkeypatch.setattr(checkpointing.torch, "save", lambda obj, handle: real_save(obj, FullDisk(room=4096)))
    with pytest.raises(CheckpointWriteError) as caught:
        io_plugin.save_checkpoint({"state_dict": {"w": torch.zeros(2**20)}}, target)   # 4 MiB of fp32
    message = str(caught.value)
    assert f"no space left on device writing checkpoint {target}" in message
    assert "it needs about 0.00 GiB" in message and "GiB free" in message   # 4 MiB = 0.004 GiB
    assert "the previous last.ckpt is intact" in message
    assert torch.load(target, weights_only=True)["state_dict"]["w"].shape == (4,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]   # no partial file left


def test_other_write_errors_name_the_file(tmp_path, monkeypatch):
    def refuse(obj, handle):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(checkpointing.torch, "save", refuse)
    with pytest.raises(CheckpointWriteError, match=r"could not write checkpoint .*step0002.ckpt: .*Permission denied; "
                                                   r"no step0002.ckpt was written before"):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "step0002.ckpt")


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path):
    (tmp_path / ".last.ckpt.abc123.tmp").write_bytes(b"\0" * 10)
    (tmp_path / ".step0003.ckpt.x9.tmp").write_bytes(b"\0")
    (tmp_path / "last.ckpt").write_bytes(b"kept")
    (tmp_path / "notes.tmp").write_bytes(b"kept")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [".last.ckpt.abc123.tmp", ".step0003.ckpt.x9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "notes.tmp"]
    assert remove_stale_temporaries(tmp_path / "absent") == []
