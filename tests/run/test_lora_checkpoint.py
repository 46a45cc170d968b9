"""A LoRA run checkpoints only what trains (run/module.py, models/base_weights.py): its checkpoint holds the adapters,
the optimizer state, the counters and RNGs and a reference to its base, not the base; it resumes exactly;
`tokenrl-export` and `load_policy` (tokenrl-eval) put its adapters on the base rebuilt from `model.*`; a checkpoint of
another base is refused, naming the checkpoint and what differs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tests.helpers.crash import Crash, CrashAfter
from tests.helpers.forked_cli import forked_python
from tokenrl.models import build_model
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import load_policy, policy_state_dict
from tokenrl.run.trained_policy import export
from tokenrl.run.training import build_components

LORA = "model.lora={r: 2, lora_alpha: 8, lora_dropout: 0.0, target_modules: [q_proj, v_proj]}"
RUN = [
    LORA,
    "task.verifier=tests.helpers.rewards:length_reward",
    "total_steps=2",
    "checkpoint.enabled=true",
    "checkpoint.every_n_steps=1",
]


def fit(cfg, *callbacks, ckpt_path=None):
    """`cfg` trained in this process (its config saved where tokenrl-export reads it: <run>/.hydra/config.yaml)."""
    config = Path(cfg.paths.output_dir) / ".hydra" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, config)
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    trainer.callbacks.extend(callbacks)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return module


def digest(model: torch.nn.Module) -> str:
    """sha256 of every state-dict entry (base and adapters)."""
    sha = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        sha.update(key.encode() + tensor.detach().numpy().tobytes())
    return sha.hexdigest()


def nbytes(tensors) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def test_a_lora_checkpoint_holds_the_adapters_alone_resumes_exactly_and_exports_the_merged_policy(tiny_cfg, tmp_path):
    straight = fit(tiny_cfg(*RUN, f"paths.output_dir={tmp_path / 'straight'}"))
    with pytest.raises(Crash):
        fit(tiny_cfg(*RUN, f"paths.output_dir={tmp_path / 'interrupted'}"), CrashAfter(1))
    last = tmp_path / "interrupted" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)

    adapters = {f"policy.{name}": param for name, param in straight.policy.named_parameters() if param.requires_grad}
    assert set(checkpoint["state_dict"]) == set(adapters) and all("lora_" in key for key in adapters)
    assert checkpoint["tokenrl"]["rollout_step"] == 1 and checkpoint["optimizer_states"][0]["state"]
    assert set(checkpoint["tokenrl"]["base"]) == {"source", "init", "dtype", "seed", "fingerprint"}
    base_bytes = nbytes(straight.policy.state_dict().values()) - nbytes(adapters.values())
    # 41 KiB: 3.5 KiB of adapters, twice that of AdamW's moments, RNG states and torch.save's per-record overhead;
    # before, the same run's checkpoint held the 354 KiB base too (372 KiB)
    assert last.stat().st_size < base_bytes / 4

    resumed = fit(tiny_cfg(*RUN, f"paths.output_dir={tmp_path / 'resumed'}"), ckpt_path=str(last))
    assert resumed.run_state.rollout_step == 2 and resumed.run_state.reward_history == straight.run_state.reward_history
    assert digest(resumed.policy) == digest(straight.policy)

    folders = {
        name: export(tmp_path / name / "checkpoints" / "last.ckpt", tmp_path / f"{name}_export")
        for name in ("straight", "resumed")
    }
    exported = {name: load_file(folder / "model.safetensors") for name, folder in folders.items()}
    assert list(exported["resumed"]) == list(exported["straight"])
    assert all(torch.equal(exported["resumed"][key], exported["straight"][key]) for key in exported["straight"])
    base_q = straight.policy.state_dict()["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert not torch.equal(exported["resumed"]["model.layers.0.self_attn.q_proj.weight"], base_q)  # merged in

    settings = ModelSettings.of(OmegaConf.to_container(tiny_cfg(*RUN).model, resolve=True))
    reloaded = build_model(settings, seed=0)  # as tokenrl-eval ckpt_path=<it> builds it
    load_policy(reloaded, tmp_path / "resumed" / "checkpoints" / "last.ckpt", settings, seed=0)
    assert digest(reloaded) == digest(straight.policy)


def test_a_lora_checkpoint_of_another_base_is_refused_naming_it_and_the_difference(tiny_cfg, tmp_path):
    """The base folder at model.source replaced by other weights (same settings): resume and export refuse the
    checkpoint (ValueError naming it and the fingerprints); another seed of a random base names the seed."""
    base = tmp_path / "base"
    settings = ModelSettings.of(OmegaConf.to_container(tiny_cfg().model, resolve=True))
    build_model(settings, seed=0).save_pretrained(base)
    pretrained = [*RUN, "model.init=pretrained", f"model.source={base}", "total_steps=1"]
    fit(tiny_cfg(*pretrained, f"paths.output_dir={tmp_path / 'first'}"))
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"

    build_model(settings, seed=1).save_pretrained(base)  # another base under the same name
    with pytest.raises(
        ValueError,
        match=rf"ckpt_path={last} holds a LoRA adapter trained on other base weights than "
        r"this run's \(the same settings, but the weights at model.source changed; "
        r"base fingerprint \w{12} there, \w{12} here\)",
    ):
        fit(tiny_cfg(*pretrained, "total_steps=2", f"paths.output_dir={tmp_path / 'resumed'}"), ckpt_path=str(last))
    with pytest.raises(ValueError, match=rf"ckpt_path={last} holds a LoRA adapter trained on other base weights"):
        export(last, tmp_path / "export")
    assert not (tmp_path / "export").exists()

    random_cfg = ModelSettings.of(OmegaConf.to_container(tiny_cfg(LORA).model, resolve=True))
    with pytest.raises(
        ValueError,
        match=r"model.source .* there, None here; model.init 'pretrained' there, 'random' "
        r"here; seed None there, 1 here.*use that base \(model.source=",
    ):
        load_policy(build_model(random_cfg, seed=1), last, random_cfg, seed=1)


@pytest.mark.slow
def test_under_fsdp_a_lora_checkpoint_of_either_kind_holds_the_adapters_and_resumes_exactly(tmp_path):
    """trainer=fsdp on 2 CPU ranks (tests/helpers/fsdp_fit.py): a sharded and a full checkpoint written after step 1
    hold the adapters alone (the sharded one's metadata names no base tensor), and a run resumed from either ends with
    the uninterrupted run's rewards and weights."""
    from torch.distributed.checkpoint import FileSystemReader

    from tests.helpers.fsdp_fit import SNAPSHOTS

    # one launch of the two ranks: the uninterrupted run (writing both step-1 checkpoints), then a resume from each
    # (each a trainer of its own; a second launch cost a start-up of both ranks, ~30 s here)
    runs = [[tmp_path / "straight", "-", "--snapshot", "total_steps=2", LORA]] + [
        [tmp_path / f"{kind}_resumed", tmp_path / "straight" / path, "total_steps=2", LORA]
        + [f"trainer.strategy.state_dict_type={kind}"]
        for kind, path in SNAPSHOTS.items()
    ]
    done = forked_python(["tests/helpers/fsdp_fit.py", *[str(arg) for run in runs for arg in ("--then", *run)][1:]])
    assert done.returncode == 0, done.stderr[-3000:]
    straight, *resumes = [torch.load(Path(run[0]) / "result.pt", weights_only=True) for run in runs]

    adapters = {name: weight for name, weight in straight["step1_weights"].items() if "lora_" in name}
    for kind, path in SNAPSHOTS.items():
        saved = policy_state_dict(tmp_path / "straight" / path)
        assert saved.keys() == adapters.keys() and all(torch.equal(saved[k], adapters[k]) for k in adapters), kind
    stored = FileSystemReader(tmp_path / "straight" / SNAPSHOTS["sharded"]).read_metadata().state_dict_metadata
    tensors = [key for key in stored if key.startswith(("model.", "optimizer_0.state."))]
    assert tensors and all("lora_" in key for key in tensors)  # the weights and AdamW's moments of adapters alone
    for kind, resumed in zip(SNAPSHOTS, resumes):
        assert resumed["rollout_step"] == 2 and resumed["reward_history"] == straight["reward_history"], kind
        assert all(torch.equal(resumed["weights"][name], weight) for name, weight in straight["weights"].items()), kind
