"""run/memory_plan.py: the shape of a configured model without loading it, and each planned component against its
formula computed here by hand (the measured comparison is scripts/bench/memory_plan.py, benchmarks/memory_plan.json)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.helpers.tiny import tiny_policy
from tokenrl.run.memory_plan import GIB, Shape, architecture_shape, plan_memory


def container(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(list(overrides)), resolve=True)


def test_the_shape_counts_the_parameters_of_the_real_model():
    model, _ = tiny_policy()
    shape = architecture_shape(container("model=tiny")["model"])
    assert shape.parameters == shape.trainable == sum(p.numel() for p in model.parameters())
    config = model.config
    assert (shape.layers, shape.hidden, shape.vocab) == (
        config.num_hidden_layers,
        config.hidden_size,
        config.vocab_size,
    )
    lora = architecture_shape(container("model=tiny", "+model.lora={r: 2, target_modules: all-linear}")["model"])
    assert lora.parameters == shape.parameters > lora.trainable > 0  # the base's; the adapters are trained


SHAPE = Shape(parameters=1_000_000, trainable=1_000_000, layers=2, hidden=64, intermediate=128, kv_width=32, vocab=500)


def test_each_component_follows_its_formula():
    cfg = container(
        "model=tiny",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=4",
        "algorithm.micro_batch_size=4",
        "rollout.max_new_tokens=10",
        "model.stats_chunk_size=16",
    )
    plan = plan_memory(cfg, SHAPE, "cpu", 100.0, prompt_tokens=20)
    update, generate, statistics = plan.phases["update"], plan.phases["generate"], plan.phases["statistics"]
    assert update["policy weights"] == pytest.approx(4e6 / GIB)  # fp32
    assert update["optimizer state"] == pytest.approx(8e6 / GIB)  # AdamW: two moments
    assert update["gradients"] == pytest.approx(4e6 / GIB)
    tokens = 1 * 20 + 4 * 10  # micro-batch of 4 rows = one group: its prompt once (shared prefix), 4 responses
    assert update["activations"] == pytest.approx(tokens * 2 * (8 * 64 + 2 * 32 + 5 * 128) * 4 / GIB)
    assert update["logits"] == pytest.approx(3 * 4 * 10 * 500 * 4 / GIB)
    assert generate["KV cache"] == pytest.approx(8 * (20 + 10) * 2 * 2 * 32 * 4 / GIB)
    assert statistics["logits"] == pytest.approx(4 * 16 * 500 * 4 / GIB)
    assert plan.peak()[0] == "update" and plan.fits()
    assert "peak" in plan.table() and plan.as_dict()["peak_phase"] == "update"


def test_a_token_budget_plans_its_tokens_not_the_rows():
    """With algorithm.micro_batch_tokens the update's forward holds at most that many tokens (a longer row alone, and
    never more than the step's), the statistics pass's whole groups at least one group; micro_batch_size no longer
    counts."""
    settings = (
        "model=tiny",
        "algorithm.prompts_per_step=4",
        "algorithm.group_size=4",
        "rollout.max_new_tokens=10",
        "model.stats_chunk_size=16",
    )
    per_token = 2 * (8 * 64 + 2 * 32 + 5 * 128) * 4 / GIB  # layers × per-layer activations, fp32

    def plan(*overrides):
        return plan_memory(container(*settings, *overrides), SHAPE, "cpu", None, prompt_tokens=20)

    for micro in (1, 4):
        budgeted = plan("algorithm.micro_batch_tokens=200", f"algorithm.micro_batch_size={micro}")
        assert budgeted.phases["update"]["activations"] == pytest.approx(200 * per_token)
        assert budgeted.phases["update"]["logits"] == pytest.approx(3 * 200 * 500 * 4 / GIB)
        assert budgeted.phases["statistics"]["hidden states"] == pytest.approx(200 * 64 * 4 / GIB)
    step = 4 * 20 + 16 * 10  # the shared prefix (the CPU's auto): each group's prompt once, every response
    huge = plan("algorithm.micro_batch_tokens=100000")
    assert huge.phases["update"]["activations"] == pytest.approx(step * per_token)
    tiny_budget = plan("algorithm.micro_batch_tokens=8")
    assert tiny_budget.phases["update"]["activations"] == pytest.approx((20 + 10) * per_token)  # one row
    assert tiny_budget.phases["statistics"]["hidden states"] == pytest.approx((20 + 4 * 10) * 64 * 4 / GIB)


def test_switches_change_what_they_should():
    base = container("model=tiny", "rollout.max_new_tokens=10")
    plan = plan_memory(base, SHAPE, "cpu", None, prompt_tokens=20)
    no_kl = plan_memory(container("model=tiny", "rollout.max_new_tokens=10", "algorithm.kl_coef=0"), SHAPE, "cpu")
    assert plan.phases["update"]["reference"] > 0 and no_kl.phases["update"]["reference"] == 0
    padded = plan_memory(
        container("model=tiny", "rollout.max_new_tokens=10", "fast_path.layout=padded"),
        SHAPE,
        "cpu",
        None,
        prompt_tokens=20,
    )
    assert padded.phases["update"]["activations"] > plan.phases["update"]["activations"]  # every row's prompt
    on_gpu = {
        value: plan_memory(
            container("model=tiny", "rollout.max_new_tokens=10", f"fast_path.layout={value}"),
            SHAPE,
            "cuda:0",
            None,
            prompt_tokens=20,
        )
        for value in ("auto", "padded", "shared_prefix", "packed")
    }
    assert (
        on_gpu["auto"].phases["update"]["activations"]
        == on_gpu["padded"].phases["update"]["activations"]
        > on_gpu["shared_prefix"].phases["update"]["activations"]
        == on_gpu["packed"].phases["update"]["activations"]
    )  # auto: padded on a GPU; the other two encode each group's prompt once
    deep = Shape(**{**vars(SHAPE), "layers": 24})
    kept, checkpointed = (
        plan_memory(
            container("model=tiny", "rollout.max_new_tokens=10", f"model.gradient_checkpointing={on}"),
            deep,
            "cpu",
            None,
            prompt_tokens=20,
        )
        for on in ("false", "true")
    )
    assert checkpointed.phases["update"]["activations"] < kept.phases["update"]["activations"]
    sgd = container("model=tiny", "algorithm.optimizer._target_=torch.optim.SGD")
    assert plan_memory(sgd, SHAPE, "cpu").phases["update"]["optimizer state"] == 0
    small = plan_memory(base, SHAPE, "cpu", capacity_gib=0.001)
    assert not small.fits()


def test_the_fused_head_plans_its_chunk_buffers_instead_of_the_logits():
    """At Qwen2.5's vocabulary the materialised head's logits dominate the update; the fused head holds
    `FUSED_HEAD_BUFFERS` fp32 buffers of one vocabulary chunk (CHUNK_ELEMENTS values, or 64 columns per token beyond
    that), in the update and the statistics pass; under FSDP the update goes through the model's own head, and no
    pass shares the prompt."""
    from tokenrl.models.lm_head import CHUNK_ELEMENTS
    from tokenrl.run.memory_plan import FUSED_HEAD_BUFFERS

    big = Shape(**{**vars(SHAPE), "vocab": 151_936})
    settings = ("model=tiny", "algorithm.micro_batch_size=8", "rollout.max_new_tokens=512")
    plans = {
        head: plan_memory(container(*settings, f"fast_path.fused_head={head}"), big, "cpu", None, prompt_tokens=20)
        for head in ("true", "false")
    }
    fused = FUSED_HEAD_BUFFERS * CHUNK_ELEMENTS * 4 / GIB  # 8 × 512 tokens: within one chunk's values
    assert plans["true"].phases["update"]["logits"] == pytest.approx(fused)
    assert plans["true"].phases["statistics"]["logits"] == pytest.approx(fused)
    materialised = plans["false"].phases["update"]["logits"]
    assert materialised == pytest.approx(3 * 8 * 512 * 151_936 * 4 / GIB) and materialised > 30 * fused
    many = plan_memory(
        container(
            "model=tiny",
            "algorithm.prompts_per_step=8",
            "algorithm.group_size=8",
            "algorithm.micro_batch_size=64",
            "rollout.max_new_tokens=4096",
            "fast_path.fused_head=true",
        ),
        big,
        "cpu",
        None,
        prompt_tokens=20,
    )
    # 64 rows × 4,096 tokens × 64 columns: twice one chunk's values
    assert many.phases["update"]["logits"] == pytest.approx(FUSED_HEAD_BUFFERS * 64 * 4096 * 64 * 4 / GIB)
    fsdp = plan_memory(
        container(*settings, "fast_path.fused_head=true", "trainer=fsdp"), big, "cpu", None, prompt_tokens=20
    )
    assert fsdp.phases["update"]["logits"] == plans["false"].phases["update"]["logits"]
    assert fsdp.phases["statistics"]["logits"] == pytest.approx(fused)
    padded = plan_memory(
        container(*settings, "fast_path.layout=padded", "trainer=gpu"), big, "cpu", None, prompt_tokens=20
    )
    # FSDP runs every pass through the root's forward: no shared prompt either (AtomicFSDPStrategy is FSDP too)
    assert fsdp.phases["update"]["activations"] == padded.phases["update"]["activations"]
