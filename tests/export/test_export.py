"""`served_weights` (models/engine_weights.py) under FSDP: 2 real processes (gloo, CPU) shard the tiny model one unit
per decoder layer (models/sharding.py); the gathered stream equals the unsharded model's export — names and values,
exactly, PEFT adapters merged — gathering one unit at a time, and leaves the sharded model as it was."""

from __future__ import annotations

import os
import re
import socket
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

from tests.conftest import compose_config
from tests.helpers.forked_cli import forked_spawn
from tokenrl.models import build_model
from tokenrl.models.engine_weights import served_weights
from tokenrl.models.sharding import shard
from tokenrl.records.settings import ModelSettings

LORA = ["+model.lora={r: 4, lora_alpha: 8, lora_dropout: 0.0, target_modules: all-linear}"]


def tiny_policy(lora: bool) -> torch.nn.Module:
    """The tiny random policy; with LoRA, adapters with non-zero B so that merging changes the served weights."""
    node = OmegaConf.to_container(compose_config(["model=tiny", *(LORA if lora else [])]).model, resolve=True)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)  # PEFT draws A from the global generator
        model = build_model(ModelSettings.of(node), seed=0)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_serving_a_lora_policy_gives_peft_merged_weights_and_leaves_the_model_bit_for_bit(dtype):
    """Each sync to the engine serves the merged weights; the frozen base must not move: merging then unmerging in
    place rounds (W + ΔW − ΔW ≠ W, by a bf16 ulp per sync in a bf16 model), which would drift over a run."""
    import copy

    model = tiny_policy(True).to(dtype)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for _ in range(2):  # a second sync serves the same
        with served_weights(model) as weights:
            served = [(name, tensor.clone()) for name, tensor in weights]
        after = model.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()  # PEFT's own merge: the same arithmetic
    assert [name for name, _ in served] == list(expected)
    assert all(torch.equal(tensor, expected[name]) for name, tensor in served)
    assert not torch.equal(
        expected["model.layers.0.self_attn.q_proj.weight"],
        before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
    )


def unsharded_export(lora: bool) -> list[tuple[str, torch.Tensor]]:
    model = tiny_policy(lora)
    with served_weights(model) as weights:
        return [(name, tensor.clone()) for name, tensor in weights]


@contextmanager
def one_unit_at_a_time(record: list[int]):
    """Spy on `summon_full_params`: appends how many units are gathered at each entry (must always be 1) and fails
    on a recursive gather (that would gather a unit's nested layers too)."""
    original = FullyShardedDataParallel.summon_full_params
    active = [0]

    @contextmanager
    def spy(module, recurse=True, **kwargs):
        assert recurse is False, "served_weights gathered a unit recursively"
        active[0] += 1
        record.append(active[0])
        try:
            with original(module, recurse=recurse, **kwargs):
                yield
        finally:
            active[0] -= 1

    FullyShardedDataParallel.summon_full_params = staticmethod(spy)
    try:
        yield
    finally:
        FullyShardedDataParallel.summon_full_params = original


def export_worker(rank: int, world: int, port: int, device_type: str, lora: bool, out: str) -> None:
    """One rank: shard the tiny policy over `world` ranks (FULL_SHARD), export it, write rank 0's results."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    strategy = SimpleNamespace(
        kwargs={"use_orig_params": True},
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision_config=None,
        cpu_offload=None,
        root_device=device,
    )
    root = shard(tiny_policy(lora), strategy)
    local = {name: param.numel() for name, param in root.named_parameters()}
    gathers: list[int] = []
    with one_unit_at_a_time(gathers), served_weights(root) as weights:
        exported = [(name, tensor.cpu()) for name, tensor in weights]
    after = {name: tensor.cpu() for name, tensor in root.state_dict().items()}  # FSDP's full state dict
    if rank == 0:
        torch.save({"exported": exported, "gathers": gathers, "after": after, "local": local}, out)
    dist.barrier()  # no rank leaves (closing its gloo pairs) while rank 0 still writes
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def export_on_ranks(tmp_path, world: int, device_type: str, lora: bool) -> dict:
    out = tmp_path / f"export_{device_type}_{world}_{lora}.pt"
    forked_spawn(export_worker, (world, free_port(), device_type, lora, str(out)), nprocs=world)
    return torch.load(out)


def check_export_equals_unsharded(result: dict, lora: bool, sharded: bool, exact: bool = True) -> None:
    """Rank 0's export against the unsharded model's (bit for bit unless `exact` is off: adapters merged on another
    device than the reference's)."""
    expected = unsharded_export(lora)
    exported = result["exported"]
    names = [name for name, _ in exported]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(name for name, _ in expected)
    assert not any(
        part in name
        for name in names
        for part in ("_fsdp_wrapped_module", "_checkpoint_wrapped", "lora_", "base_layer", "base_model")
    )
    got = dict(exported)
    for name, tensor in expected:
        if exact:
            assert torch.equal(got[name], tensor), name
        else:
            torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    # each decoder layer's tensors arrive together and in layer order (the engine buckets by layer)
    layers = [int(match.group(1)) for name in names if (match := re.search(r"\.layers\.(\d+)\.", name))]
    assert layers == sorted(layers)
    # one summon per unit (root + 2 layers), never two units gathered at once
    assert result["gathers"] == [1, 1, 1]
    # the export changed nothing: FSDP's full state dict still holds the unmerged weights
    model = tiny_policy(lora)
    assert result["after"].keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(result["after"][name], tensor), name
    if sharded:  # rank 0 really held a shard only
        assert sum(result["local"].values()) < sum(p.numel() for p in model.parameters())
    if lora:  # merging mattered
        plain = dict(unsharded_export(False))
        name = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(got[name], plain[name])


@pytest.mark.slow
@pytest.mark.parametrize("world, lora", [(2, False), (2, True), (1, True)], ids=["full", "lora", "lora-one-rank"])
def test_fsdp_export_equals_the_unsharded_weights(tmp_path, world, lora):
    """On one rank FSDP keeps whole parameters (NO_SHARD) and a gathered unit is the model's own storage: merging
    the adapters there must not leave the base weights changed by the merge's rounding (seen on one GPU)."""
    check_export_equals_unsharded(export_on_ranks(tmp_path, world, "cpu", lora), lora, sharded=world > 1)
