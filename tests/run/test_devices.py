"""run/devices.py: a one-process run on GPU k ≠ 0 sees only that GPU (CUDA_VISIBLE_DEVICES, through an existing one) as
device 0, before CUDA starts; several devices, GPU 0, counts and CPUs are left alone; it composes with launcher=local's
per-slot GPUs."""

from __future__ import annotations

import logging
import os

import pytest

from hydra_plugins.tokenrl_launcher.fresh_process import slot_devices
from tests.conftest import compose_config
from tokenrl.run.devices import device_indices, narrow_to_trainer_gpu, narrowed, runs_on_gpu

VISIBLE = "CUDA_VISIBLE_DEVICES"


def test_device_indices_follow_lightning():
    assert [device_indices(d) for d in ([3], (1, 2), "3,", "1, 2", 1, -1, "2", "auto")] == [
        [3],
        [1, 2],
        [3],
        [1, 2],
        None,
        None,
        None,
        None,
    ]


@pytest.mark.parametrize(
    "environ,devices,expected",
    [
        ({}, [3], "3"),  # all GPUs visible: GPU 3 itself
        ({VISIBLE: "4,5,6"}, [2], "6"),  # the third of the visible ones
        ({VISIBLE: " 4, 5 "}, "1,", "5"),  # Lightning's string form, spaces
        ({VISIBLE: "GPU-aa,GPU-bb"}, [1], "GPU-bb"),  # ids by UUID
    ],
)
def test_one_gpu_k_is_the_only_visible_one_and_becomes_device_0(environ, devices, expected):
    environ = {"HOME": "/x", **environ}
    assert narrowed(environ, "gpu", devices) == ({**environ, VISIBLE: expected}, [0])


@pytest.mark.parametrize(
    "accelerator,devices",
    [
        ("gpu", 1),
        ("gpu", -1),
        ("gpu", 2),
        ("gpu", [0]),
        ("gpu", [1, 2]),
        ("gpu", "1,2"),
        ("cpu", [3]),
        ("cpu", 2),
        ("cuda", "auto"),
    ],
)
def test_counts_several_devices_gpu_0_and_cpus_are_left_alone(accelerator, devices):
    environ = {VISIBLE: "4,5,6"}
    assert narrowed(environ, accelerator, devices) == (environ, devices)


def test_an_index_past_the_visible_gpus_is_named_with_the_fix():
    with pytest.raises(
        ValueError,
        match=r"trainer.devices=\[1\] asks for visible GPU 1, and CUDA_VISIBLE_DEVICES=5 "
        r"makes 1 visible .*use trainer.devices=1 for the first visible GPU",
    ):
        narrowed({VISIBLE: "5"}, "gpu", [1])
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES= makes 0 visible"):
        narrowed({VISIBLE: ""}, "gpu", [1])


def test_launcher_local_slots_compose():
    """launcher=local gives slot i its own GPUs; inside a slot `trainer.devices=1` is the slot's GPU (untouched) and
    `[j]` the slot's j-th."""
    slots = slot_devices(2, 2, ["0", "1", "2", "3"])
    assert narrowed(slots[1], "gpu", 1) == (slots[1], 1)  # GPUs 2,3; the trainer takes 2
    assert narrowed(slots[1], "gpu", [1]) == ({VISIBLE: "3"}, [0])
    with pytest.raises(ValueError, match="launcher=local gets hydra.launcher.gpus_per_job"):
        narrowed(slot_devices(2, 1, ["0", "1"])[1], "gpu", [1])


def test_the_run_narrows_before_anything_else_and_says_so(monkeypatch, caplog):
    """`train.run` narrows first (before the config check, the model, Lightning: before CUDA starts)."""
    import tokenrl.run.training as train

    class Stop(Exception):
        pass

    seen = {}

    def checked_settings(cfg, overrides):
        seen.update(visible=os.environ[VISIBLE], devices=list(cfg.trainer.devices))
        raise Stop

    monkeypatch.setenv(VISIBLE, "5,7")
    monkeypatch.setattr(train, "checked_settings", checked_settings)
    cfg = compose_config(["trainer=gpu", "trainer.devices=[1]"])
    with caplog.at_level(logging.INFO, logger="tokenrl.run.devices"), pytest.raises(Stop):
        train.run(cfg)
    assert seen == {"visible": "7", "devices": [0]}
    assert (
        "trainer.devices=[1]: this one-process run sees only that GPU (CUDA_VISIBLE_DEVICES=7, from 5,7)" in caplog.text
    )


def test_applying_leaves_a_cpu_run_alone(monkeypatch):
    monkeypatch.delenv(VISIBLE, raising=False)
    cfg = compose_config(["trainer=cpu"])
    narrow_to_trainer_gpu(cfg)
    assert VISIBLE not in os.environ and cfg.trainer.devices == 1


@pytest.mark.parametrize("accelerator, expected", [("gpu", True), ("cuda", True), ("cpu", False)])
def test_runs_on_gpu_reads_the_trainers_accelerator(accelerator, expected):
    import torch

    assert runs_on_gpu(compose_config([f"trainer.accelerator={accelerator}"])) is expected
    assert runs_on_gpu(compose_config(["trainer.accelerator=auto"])) is torch.cuda.is_available()
