"""run/memory_plan.py: the shape of a configured model without loading it, and each planned component against its
formula computed here by hand (measured against real runs: tests/run/test_memory_plan_runs.py,
scripts/bench/memory_plan.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.helpers.tiny import tiny_policy, tiny_settings
from tokenrl.run.memory_plan import GIB, Shape, architecture_shape, largest_micro_batch, memory_refusal, plan_memory
from tokenrl.step.micro_batches import MicroBatchCut


def container(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(list(overrides)), resolve=True)


def test_the_shape_counts_the_parameters_of_the_real_model():
    model, _ = tiny_policy()
    shape = architecture_shape(tiny_settings())
    assert shape.parameters == shape.trainable == sum(p.numel() for p in model.parameters())
    config = model.config
    assert (shape.layers, shape.hidden, shape.vocab) == (
        config.num_hidden_layers,
        config.hidden_size,
        config.vocab_size,
    )
    assert shape.tied and shape.layer_trainable == shape.trainable - config.vocab_size * config.hidden_size
    lora = architecture_shape(tiny_settings(lora={"r": 2, "target_modules": "all-linear"}))
    assert lora.parameters == shape.parameters > lora.trainable > 0  # the base's; the adapters are trained
    assert lora.layer_trainable == lora.trainable  # the adapters sit in the decoder layers


SHAPE = Shape(
    parameters=1_000_000,
    trainable=1_000_000,
    layers=2,
    hidden=64,
    intermediate=128,
    kv_width=32,
    vocab=500,
    layer_trainable=1_000_000 - 500 * 64,  # all but the (tied) embedding
)
PER_TOKEN = 2 * (8 * 64 + 2 * 32 + 5 * 128) * 4  # layers × per-layer activations, fp32


def test_each_component_follows_its_formula():
    """Two groups of 4 rows in micro-batches of 4 (one group each): the update's backward holds the gradients, the
    activations and the gradient shares that wait — the tied embedding's two and, the shared prefix running the decoder
    twice, the decoder's first shares; in the padded layout the forward's end is the larger moment."""
    settings = (
        "model=tiny",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=4",
        "algorithm.micro_batch_size=4",
        "rollout.max_new_tokens=10",
        "model.stats_chunk_size=16",
    )
    plan = plan_memory(container(*settings), SHAPE, "cpu", 100.0, prompt_tokens=20)
    update, generate, statistics = plan.phases["update"], plan.phases["generate"], plan.phases["statistics"]
    assert update["policy weights"] == pytest.approx(4e6 / GIB)  # fp32
    assert update["optimizer state"] == pytest.approx(8e6 / GIB)  # AdamW: two moments
    assert update["gradients"] == pytest.approx(4e6 / GIB)
    tokens = 1 * 20 + 4 * 10  # micro-batch of 4 rows = one group: its prompt once (shared prefix), 4 responses
    assert update["activations"] == pytest.approx(tokens * PER_TOKEN / GIB)
    assert update["gradient buffers"] == pytest.approx((2 * 500 * 64 + SHAPE.layer_trainable) * 4 / GIB)
    assert "logits" not in update  # the backward is the larger moment here
    padded = plan_memory(container(*settings, "fast_path.layout=padded"), SHAPE, "cpu", 100.0, prompt_tokens=20)
    head = 3 * 40 * 500 * 4 + 3 * 16 * 500 * 4  # 3 copies of the responses' logits, 3 of a group's statistics chunk
    assert padded.phases["update"]["logits"] == pytest.approx(head / GIB)  # each row's prompt: the forward is larger
    assert padded.phases["update"]["activations"] == pytest.approx(4 * 30 * PER_TOKEN / GIB)
    assert generate["KV cache"] == pytest.approx(8 * (20 + 10) * 2 * 2 * 32 * 4 / GIB)
    assert statistics["logits"] == pytest.approx(3 * 40 * 500 * 4 / GIB)  # the reference's pass: 4 rows' logits
    no_kl = plan_memory(container(*settings, "algorithm.kl_coef=0"), SHAPE, "cpu", 100.0, prompt_tokens=20)
    assert no_kl.phases["statistics"]["logits"] == pytest.approx(4 * 16 * 500 * 4 / GIB)  # a group's chunk
    assert plan.peak()[0] == "update" and plan.fits()
    assert "peak" in plan.table() and plan.as_dict()["peak_phase"] == "update"


def test_the_backward_holds_the_shares_that_wait_for_their_gradients():
    """Beside the gradients of earlier micro-batches a backward holds the embedding's dense gradient (and a tied head's
    share) and, in the shared prefix, the decoder's first shares; in a step of one micro-batch those become the
    gradients, and only a tied head's share waits; a LoRA policy's embedding does not train."""
    settings = ("model=tiny", "algorithm.prompts_per_step=2", "algorithm.group_size=4", "rollout.max_new_tokens=10")

    def buffers(shape: Shape, *overrides: str) -> float:
        update = plan_memory(container(*settings, *overrides), shape, "cpu", None, prompt_tokens=20).phases["update"]
        return update.get("gradient buffers", 0.0) * GIB / 4

    wide = Shape(**{**vars(SHAPE), "hidden": 256})  # an embedding wider than the responses' logits: the backward wins
    embedding = 500 * 256
    several = "algorithm.micro_batch_size=4"
    assert buffers(wide, several) == pytest.approx(2 * embedding + SHAPE.layer_trainable)
    assert buffers(wide, several, "fast_path.layout=packed") == pytest.approx(2 * embedding)  # the decoder once
    untied = Shape(**{**vars(wide), "tied": False, "parameters": 1_128_000, "trainable": 1_128_000})
    assert buffers(untied, several, "fast_path.layout=padded") == pytest.approx(embedding)
    assert buffers(wide, "algorithm.micro_batch_size=8") == pytest.approx(embedding)  # one micro-batch, tied
    assert buffers(untied, "algorithm.micro_batch_size=8") == 0
    lora = Shape(**{**vars(SHAPE), "trainable": 400_000, "layer_trainable": 400_000})
    assert buffers(lora, several) == pytest.approx(400_000)  # the adapters' first shares only


@pytest.mark.parametrize(
    "layout,prompts,budget,whole,tokens,head,several",
    [
        ("shared_prefix", 4, 200, False, 3 * 20 + 12 * 10, 12 * 10, True),  # 3 groups fit in 200; a 4th row would not
        ("shared_prefix", 4, 8, False, 20 + 10, 10, True),  # a row longer than the budget runs alone
        ("shared_prefix", 4, 50, True, 20 + 4 * 10, 40, True),  # whole groups: a group longer than it, alone
        ("padded", 4, 200, False, 6 * (20 + 10), 60, True),  # each row its prompt
        ("packed", 2, 10_000, False, 2 * 20 + 8 * 10, 80, False),  # never more than the step
        ("shared_prefix", 4, None, False, 2 * 20 + 3 * 10, 30, True),  # 3 rows (micro_batch_size) over two groups
    ],
)
def test_the_plan_takes_the_micro_batch_the_cut_really_makes(layout, prompts, budget, whole, tokens, head, several):
    """`largest_micro_batch` cuts a worst-case step (groups of 4, prompts of 20 tokens, responses of 10) with the run's
    own cut (step/micro_batches.py): whole rows (or groups) within the budget as the layout counts them, or 3 rows."""
    step = [(group, 20, 10) for group in range(prompts) for _ in range(4)]
    cut = largest_micro_batch(MicroBatchCut(3, budget, layout), step, whole_groups=whole)
    assert (cut.tokens, cut.response_tokens, cut.several) == (tokens, head, several)


def test_a_token_budget_plans_its_tokens_not_the_rows():
    """With algorithm.micro_batch_tokens the update's forward holds the micro-batch the budget really cuts (whole rows:
    under 200 tokens three groups, 180; a longer row alone; never more than the step), the statistics pass's whole
    groups at least one group; micro_batch_size no longer counts."""
    settings = (
        "model=tiny",
        "algorithm.prompts_per_step=4",
        "algorithm.group_size=4",
        "rollout.max_new_tokens=10",
        "model.stats_chunk_size=16",
    )

    def plan(*overrides):
        return plan_memory(container(*settings, *overrides), SHAPE, "cpu", None, prompt_tokens=20)

    for micro in (1, 4):
        budgeted = plan("algorithm.micro_batch_tokens=200", f"algorithm.micro_batch_size={micro}")
        assert budgeted.phases["update"]["activations"] == pytest.approx(180 * PER_TOKEN / GIB)
        assert budgeted.phases["statistics"]["hidden states"] == pytest.approx(180 * 64 * 4 / GIB)
    step = 4 * 20 + 16 * 10  # the shared prefix (the CPU's auto): each group's prompt once, every response
    huge = plan("algorithm.micro_batch_tokens=100000")
    assert huge.phases["update"]["activations"] == pytest.approx(step * PER_TOKEN / GIB)
    tiny_budget = plan("algorithm.micro_batch_tokens=8")
    assert tiny_budget.phases["update"]["activations"] == pytest.approx((20 + 10) * PER_TOKEN / GIB)  # one row
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
    chunk = 64  # model=tiny's stats_chunk_size: the statistics from the update's own logits, one group's chunk
    assert materialised == pytest.approx(3 * (8 * 512 + chunk) * 151_936 * 4 / GIB) and materialised > 30 * fused
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


def test_a_refusal_shows_the_table_once_and_offers_only_what_is_off():
    """A plan that does not fit stops the run with its table once and what the run can still change: LoRA and
    gradient checkpointing only where they are off, the token budget where one is set, else the rows."""
    plain = container("model=tiny")
    plan = plan_memory(plain, SHAPE, "cpu", capacity_gib=0.001)
    message = memory_refusal(plan, plain)
    assert not plan.fits() and message.count(plan.table()) == 1 and message.count("peak ") == 1
    assert "LoRA (model.lora)" in message and "model.gradient_checkpointing=true" in message
    assert "algorithm.micro_batch_size (now 8)" in message
    on = container(
        "model=tiny",
        "+model.lora={r: 2, target_modules: all-linear}",
        "model.gradient_checkpointing=true",
        "algorithm.micro_batch_tokens=200",
    )
    offered = memory_refusal(plan_memory(on, SHAPE, "cpu", capacity_gib=0.001), on)
    assert "LoRA" not in offered and "gradient_checkpointing" not in offered
    assert "a smaller algorithm.micro_batch_tokens (now 200)" in offered and "micro_batch_size" not in offered
