"""`check_config` (config/check.py): every preset, experiment and method passes; each kind of bad setting is named
with its value and what is allowed, all of them at once, before anything loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import CONFIG_DIR, compose_config
from tokenrl.config.check import ConfigError, check_config, nearest

EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
METHODS = sorted(p.stem for p in (Path(CONFIG_DIR) / "method").glob("*.yaml"))


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        check_config(compose_config(list(overrides)), overrides)
    return caught.value.problems


@pytest.mark.parametrize(
    "overrides",
    [[]]
    + [[f"experiment={e}"] for e in EXPERIMENTS]
    + [[f"method={m}"] for m in METHODS]
    + [[f"model={m}"] for m in ("qwen7b", "tiny")]
    + [["selector=ict"], ["+model.lora={r: 4}"], ["trainer=ddp"], ["trainer=fsdp"]]
    + [["algorithm=dapo", f"method={m}"] for m in ("sapo", "dppo", "gspo_seq", "cispo")]
    + [["experiment=ict_paper", "method=icepop"], ["experiment=entropy20_dapo", "method=dppo"]]
    + [["task=forks", f"method={m}"] for m in METHODS],
)
def test_every_shipped_config_passes(overrides):
    check_config(compose_config(overrides), overrides)


@pytest.mark.parametrize(
    "override,expected",
    [
        ("total_steps=-1", "total_steps=-1: must be an integer >= 1"),
        ("total_steps=ten", "total_steps='ten': must be an integer >= 1"),
        ("total_steps=true", "total_steps=True: must be an integer >= 1"),
        ("seed=1.5", "seed=1.5: must be an integer >= 0"),
        ("rollout.top_p=2", "rollout.top_p=2: must be a number in (0, 1]"),
        ("rollout.temperature=0", "rollout.temperature=0: must be a number > 0 (greedy decoding: rollout.top_k=1)"),
        ("rollout.top_k=-3", "rollout.top_k=-3: must be an integer >= 0 (0 or -1: off; 1: greedy)"),
        ("checkpoint.mode=best", "checkpoint.mode='best': must be one of min, max"),
        ("fast_path.pack=yes", "fast_path.pack='yes': must be true or false"),
        ("reward_timeout_s=0", "reward_timeout_s=0: must be a number > 0"),
        ("selector_ratio=0", "selector_ratio=0: must be a number in (0, 1]"),  # as typed, not as selector.ratio
        ("algorithm.optimizer.lr=-1", "algorithm.optimizer.lr=-1: must be a number > 0"),
        ("algorithm.optimizer.betas=[0.9,1.5]", "algorithm.optimizer.betas=[0.9, 1.5]: must be two numbers in [0, 1)"),
        ("selector.normalizer=mean", "selector.normalizer='mean': must be one of selected, all"),
        (
            "+totl_steps=5",
            "+totl_steps: no such setting at the top level; nothing would read it (did you mean `total_steps`?)",
        ),
        (
            "+validation.every_n_step=3",
            "+validation.every_n_step: no such setting at `validation`; nothing would read it "
            "(did you mean `every_n_steps`?)",
        ),
        (
            "+trainer.max_epoch=3",
            "trainer.max_epoch: lightning.pytorch.Trainer takes no such setting (did you mean `max_epochs`?)",
        ),
        ("+trainer.max_steps=3", "trainer.max_steps=3: set by tokenrl; use total_steps instead"),
        ("+selector.ratios=0.2", "selector.ratios: tokenrl.selectors.UniformSelector takes no such setting"),
        (
            "+algorithm.optimizer.betas2=0.9",
            "algorithm.optimizer.betas2: torch.optim.AdamW takes no such setting (did you mean `betas`?)",
        ),
    ],
)
def test_a_bad_setting_is_named_with_what_is_allowed(override, expected):
    assert problems(override) == [expected]


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["algorithm.group_size=1"], "algorithm.group_size=1 must be >= 2"),
        (["validation.ks=[1,8]"], "validation.ks=[1, 8]: each k must be an integer in [1, validation.n_samples=4]"),
        (["algorithm.mini_batches=3"], "algorithm.mini_batches=3: the 32 responses of a step"),
        (
            ["selector=ict", "selector_warmup_steps=20", "total_steps=20"],
            "selector_warmup_steps=20: selector ICTSelector updates every token",
        ),
        (["selector=random", "selector_warmup_steps=25", "total_steps=20"], "never selects"),
        (
            ["rollout=vllm", "rollout.max_num_batched_tokens=1024"],
            "rollout.max_num_batched_tokens=1024: below rollout.max_model_len=2048 without chunked prefill",
        ),
        (
            ["algorithm.tis_mode=sequence_mask"],
            "algorithm.tis_mode=sequence_mask has no effect while algorithm.tis_cap=null",
        ),
        (["method=icepop", "algorithm.tis_min=6"], "algorithm.tis_min=6.0 must lie in (0, algorithm.tis_cap=5.0)"),
        (
            ["method=sapo", "algorithm.dual_clip=3"],
            "algorithm.dual_clip=3.0 does not apply to algorithm.policy_loss=sapo",
        ),
        (["method=dppo", "algorithm.dppo_divergence=js"], "algorithm.dppo_divergence='js' is not one of ('tv', 'kl')"),
        (["method=dppo", "algorithm.mini_batches=3"], "algorithm.mini_batches=3: the 32 responses of a step"),
        (
            ["trainer=fsdp", "algorithm.micro_batch_tokens=4096"],
            "algorithm.micro_batch_tokens=4096 with trainer=fsdp: each rank cuts its own rows by their lengths",
        ),
        (
            ["trainer.devices=3", "algorithm.prompts_per_step=6"],  # 6 prompts: the count alone is wrong
            f"trainer.devices=3: this machine has {len(os.sched_getaffinity(0))} CPU cores",
        )
        if len(os.sched_getaffinity(0)) < 3
        else (["trainer.devices=64", "algorithm.prompts_per_step=64"], "trainer.devices=64: this machine has"),
        (
            ["trainer.devices=2", "trainer.strategy=ddp", "algorithm.prompts_per_step=3"],
            "trainer.devices=2: algorithm.prompts_per_step=3 must be divisible by the 2 training processes",
        ),
    ],
)
def test_a_broken_relation_is_named(overrides, expected):
    [problem] = problems(*overrides)
    assert expected in problem


def test_every_bad_setting_is_reported_at_once():
    found = problems("total_steps=-1", "rollout.top_p=2", "+totl_steps=5")
    assert len(found) == 3


def test_a_warmup_over_half_the_run_is_a_warning_not_an_error():
    warnings = check_config(compose_config(["selector=ict", "selector_warmup_steps=15", "total_steps=20"]))
    assert warnings == [
        "selector_warmup_steps=15 covers most of total_steps=20: the selector acts on only the last 5 steps"
    ]
    assert check_config(compose_config(["selector=uniform", "selector_warmup_steps=15"])) == []


def test_the_headline_command_selects():
    """`python train.py selector=ict model=qwen1.5b` (default total_steps) runs ICT from the first step."""
    cfg = compose_config(["selector=ict", "model=qwen1.5b"])
    assert cfg.selector.warmup_steps < cfg.total_steps and check_config(cfg) == []


def test_nearest_suggests_only_close_keys():
    assert nearest("totl_steps", ["total_steps", "seed"]) == " (did you mean `total_steps`?)"
    assert nearest("zzz", ["total_steps", "seed"]) == ""


@pytest.mark.parametrize("selector", ["forks_oracle", "forks_matched_random"])
def test_a_selector_that_reads_the_true_forks_is_refused_on_a_task_that_cannot_name_them(selector):
    assert problems(f"selector={selector}") == [
        f"selector={selector}: reads the task's true forks, which tokenrl.data.tasks.ArithmeticTask cannot name; "
        "use task=forks"
    ]
    check_config(compose_config(["task=forks", f"selector={selector}"]))
