"""The rollout contract (rollout/engine.py): engine calls run with autocast off, even inside `training_step`, which
Lightning wraps in autocast under `precision=bf16-mixed` (an engine computes in its own dtype; CUDA autocast would
rewrite vLLM's torch ops); the response mask stops after the first EOS."""

from __future__ import annotations

import lightning as L
import torch

from tokenrl.rollout.engine import response_mask_until_eos
from tokenrl.rollout.hf import HFEngine
from tokenrl.run.training import build_components


class AutocastRecordingEngine(HFEngine):
    """Records, for every generate / sync call, whether autocast was on where the module called it and inside."""

    calls: list[tuple[str, bool, bool]] = []

    def generate(self, prompt_ids, params, seed):
        self.outside = torch.is_autocast_enabled("cpu")
        return super().generate(prompt_ids, params, seed)

    def _generate(self, prompt_ids, params, seed):
        self.calls.append(("generate", self.outside, torch.is_autocast_enabled("cpu")))
        return super()._generate(prompt_ids, params, seed)

    def sync_weights(self, model, version):
        self.outside = torch.is_autocast_enabled("cpu")
        super().sync_weights(model, version)

    def _sync_weights(self, model, version):
        self.calls.append(("sync", self.outside, torch.is_autocast_enabled("cpu")))
        super()._sync_weights(model, version)


class SwapEngine(L.Callback):
    def on_train_start(self, trainer, module) -> None:
        module.engine = AutocastRecordingEngine(module.policy, module.tokenizer, module.run_state.optimizer_steps)


def test_engine_calls_run_with_autocast_off(tiny_cfg):
    cfg = tiny_cfg("trainer.precision=bf16-mixed", "total_steps=2")
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    trainer.callbacks.append(SwapEngine())
    AutocastRecordingEngine.calls = []
    trainer.fit(module, datamodule=datamodule)
    calls = AutocastRecordingEngine.calls
    assert [name for name, _, _ in calls] == ["generate", "sync", "generate", "sync"]
    assert all(outside for _, outside, _ in calls)  # the module calls the engine under bf16 autocast …
    assert not any(inside for _, _, inside in calls)  # … and the engine runs with it off


def test_response_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 6, 1, 7, 1], [5, 5, 5, 5, 5]])
    mask, reasons = response_mask_until_eos(ids, [1])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]] and reasons == ["stop", "length"]
