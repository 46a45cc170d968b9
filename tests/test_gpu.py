"""The GPU path on a real GPU (skipped elsewhere, with the reason): the vLLM engine follows the trained weights with
sleep mode on; one `trainer=gpu precision=bf16-mixed` step of the tiny model and of the Qwen2.5-0.5B architecture
(random weights, no download); FSDP on one GPU with gradient clipping equals the plain GPU step; the FSDP weight
export equals the unsharded weights. Needs torch with CUDA, transformers, lightning, peft; (a) also vLLM."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.export.test_export import check_export_equals_unsharded, export_on_ranks
from tests.helpers.ddp_step import one_step
from tests.helpers.markers import requires_cuda, requires_vllm
from tests.rollout.test_vllm_engine import engine_completion_logprobs, raise_likelihood, trainer_completion_logprobs

pytestmark = requires_cuda
QWEN_RANDOM = ["model=qwen0.5b", "model.init=random", "model.tokenizer=char"]  # the architecture, offline


@requires_vllm
def test_vllm_engine_follows_the_trained_weights_with_sleep_on():
    """bf16 engine, sleep level 2 between generation and the update: after two optimizer steps and a sync, the engine
    scores a completion as the fp32 trainer does (within bf16's resolution) and differently from before."""
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.records.settings import ModelSettings, RolloutSettings
    from tokenrl.rollout import build_engine
    from tokenrl.rollout.engine import SamplingParams

    cfg = compose_config([*QWEN_RANDOM, "rollout=vllm_gpu", "rollout.max_model_len=256", "rollout.enforce_eager=true"])
    model = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    policy, tokenizer = build_model(model).cuda(), build_tokenizer(model)
    engine = build_engine(RolloutSettings.of(OmegaConf.to_container(cfg.rollout, resolve=True)), policy, tokenizer)
    try:
        assert engine.sleep_level == 2 and engine.dtype == torch.bfloat16
        prompts = [tokenizer("What is 2 + 3?")["input_ids"], tokenizer("Name a colour.")["input_ids"]]
        params = SamplingParams(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16)
        batch = engine.generate(prompts, params, seed=3)
        prompt, completion = prompts[0], batch.response_ids[0][batch.response_mask[0].bool()].tolist()
        before = engine_completion_logprobs(engine, prompt, completion)
        engine.sleep()
        assert engine.sleeping
        raise_likelihood(policy, prompt, completion, lr=1e-3)
        engine.sync_weights(policy, 2)
        after = engine_completion_logprobs(engine, prompt, completion)
        trainer = trainer_completion_logprobs(policy, prompt, completion).detach().cpu()
        assert (after - trainer).abs().max() < 0.05  # stated tolerance: bf16 engine vs fp32 trainer
        assert (after - before).abs().max() > 0.5  # it really moved with the weights
        assert engine.generate(prompts, params, seed=3).weights_version == 2
    finally:
        engine.close()


def fit_one_step(tmp_path, *overrides: str):
    """One rollout step of the real module with the project's defaults (AdamW, KL on), 2 prompts × 4, rewarded by
    the first character's parity (a random model earns no arithmetic reward, so its advantages would all be 0)."""
    import lightning as L

    from tokenrl.run.training import build_components

    cfg = compose_config(
        [
            "logger=none",
            "checkpoint.enabled=false",
            "validation.every_n_steps=0",
            "task.verifier=tests.helpers.rewards:parity_reward",  # rewards vary: the step moves weights
            "samples.every_n_steps=0",
            "trainer.enable_progress_bar=false",
            "total_steps=1",
            "algorithm.prompts_per_step=2",
            "algorithm.group_size=4",
            "rollout.max_new_tokens=32",
            *overrides,
        ],
        output_dir=tmp_path,
    )

    class Devices(L.Callback):
        """Where the policy's weights were during the step (Lightning's teardown moves the module to the CPU after)."""

        def __init__(self) -> None:
            self.seen: list[torch.device] = []

        def on_train_batch_end(self, trainer, module, *args) -> None:
            self.seen.append(next(module.policy.parameters()).device)

    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    module.configure_model()
    initial = {name: p.detach().cpu().clone() for name, p in module.policy.named_parameters()}
    devices = Devices()
    trainer.callbacks.append(devices)
    trainer.fit(module, datamodule=datamodule)
    return module, trainer, initial, devices.seen


@pytest.mark.parametrize("model", [["model=tiny"], QWEN_RANDOM], ids=["tiny", "qwen0.5b-random"])
def test_one_bf16_mixed_step_on_a_gpu(tmp_path, model):
    module, trainer, initial, devices = fit_one_step(tmp_path, "trainer=gpu", "trainer.precision=bf16-mixed", *model)
    assert module.run_state.rollout_step == 1 and module.run_state.optimizer_steps == 1
    assert [device.type for device in devices] == ["cuda"]
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    for key in ("train/loss", "train/kl", "train/entropy", "train/logprob_gap_max"):
        assert math.isfinite(metrics[key]), key
    moved = max(float((p.detach().cpu() - initial[name]).abs().max()) for name, p in module.policy.named_parameters())
    assert moved > 0
    reference = module._reference[0]
    expected = torch.bfloat16 if model == QWEN_RANDOM else torch.float32  # model.reference_dtype of the preset
    assert next(reference.parameters()).dtype == expected and next(reference.parameters()).is_cuda
    assert reference.model.rotary_emb.inv_freq.dtype == torch.float32


def test_fsdp_on_one_gpu_with_gradient_clipping_equals_the_plain_gpu_step(tmp_path):
    """FSDP's path (root clip_grad_norm_, the update through the root's forward, no-grad passes with the root
    gathered) on one GPU gives the plain GPU step's weights; the first optimizer step's gradient is clipped to 1.0."""
    clip = "algorithm.grad_clip=1.0"
    plain = one_step(tmp_path / "plain", ["trainer=gpu", "trainer.precision=32-true", clip])
    fsdp = one_step(
        tmp_path / "fsdp",
        [
            "trainer=fsdp",
            "trainer.devices=1",
            "trainer.precision=32-true",
            clip,
            "trainer.strategy.mixed_precision.param_dtype=null",
        ],
    )
    assert fsdp["counts"][:, 1].tolist() == [2]
    assert plain["grad_norms"][0] == pytest.approx(1.0, abs=1e-5)
    assert fsdp["grad_norms"] == pytest.approx(plain["grad_norms"], rel=1e-3)
    assert fsdp["weights"].keys() == plain["weights"].keys()
    for name, weight in plain["weights"].items():
        torch.testing.assert_close(fsdp["weights"][name], weight, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp_export_on_gpus_equals_the_unsharded_weights(tmp_path, lora):
    """On every visible GPU up to 2 (NCCL; one GPU: FSDP keeps whole parameters but the export path is the same)."""
    world = min(2, torch.cuda.device_count())
    check_export_equals_unsharded(
        export_on_ranks(tmp_path, world, "cuda", lora), lora, sharded=world > 1, exact=not lora
    )  # LoRA's B·A is computed on the GPU here, on the CPU unsharded
