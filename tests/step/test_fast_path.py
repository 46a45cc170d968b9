"""The `fast_path` node (step/fast_path.py, issue #15): its record refuses what is not a setting; end to end with
the real Trainer and the tiny model the run says once which shortcuts its update takes, logs whether the statistics
came from the update's forward (`train/fused_statistics`), and one step with every shortcut on moves the weights as
one with every shortcut off."""

from __future__ import annotations

import copy
import logging

import lightning as L
import pytest
import torch

from tokenrl.run.training import build_components
from tokenrl.step.fast_path import AUTO_LAYOUT, FastPath, ForwardPlan

ICT = [
    "selector=ict",
    "selector_warmup_steps=0",
    "total_steps=1",
    "samples.every_n_steps=0",
    "task.verifier=tests.helpers.rewards:length_reward",
]
# Plain SGD without clipping: the weights move by the gradient itself, so a wrong scale shows (clipping to a norm would
# hide one; AdamW's first step divides each gradient by its own magnitude, so an element whose gradient is ~1e-9 would
# turn float32 rounding of the layouts into ~1e-5 of weight).
SGD = [
    "algorithm.optimizer._target_=torch.optim.SGD",
    "~algorithm.optimizer.betas",
    "~algorithm.optimizer.weight_decay",
    "algorithm.optimizer.lr=1.0",
    "algorithm.grad_clip=null",
]
ALL_OFF = ["fast_path.layout=padded", "fast_path.fused_statistics=false", "fast_path.pack=false"]


# ------------------------------------------------------------------------------------------------- the record
def plan_of(fast_path, policy):
    return ForwardPlan(1.0, 4, 8, fast_path=fast_path).resolved(policy)


def layouts(plan):
    """(the no-grad passes' layout, the update's)."""
    return plan.layout(with_grad=False), plan.layout(with_grad=True)


def test_every_shortcut_is_on_by_default():
    cpu_default = FastPath(AUTO_LAYOUT["cpu"], True, True, layout_auto=True)
    assert FastPath.from_node(None) == FastPath.from_node({}) == cpu_default
    assert FastPath.from_node({"pack": False, "layout": "padded"}) == FastPath("padded", True, False)


def test_the_layout_auto_is_the_devices_measured_choice_and_the_log_says_so():
    """`auto` (the default in train.yaml) takes `AUTO_LAYOUT`'s layout for the run's device — on a GPU the padded one,
    where the shared prefix measured 2× slower in the update (docs/algorithms.md §12.1) — and the run's update-path line
    says the layout came from `auto`. A named layout is taken on any device."""
    on_cpu, on_gpu = FastPath.from_node({"layout": "auto"}), FastPath.from_node({"layout": "auto"}, True)
    assert (on_cpu.layout, on_gpu.layout) == (AUTO_LAYOUT["cpu"], AUTO_LAYOUT["cuda"]) == ("shared_prefix", "padded")
    assert on_cpu.layout_auto and on_gpu.layout_auto
    assert FastPath.from_node({"layout": "packed"}, on_gpu=True).layout == "packed"
    from tests.models.test_response_forward import tiny_qwen2

    policy = tiny_qwen2()
    assert layouts(plan_of(on_gpu, policy)) == ("padded", "padded")
    assert layouts(plan_of(on_cpu, policy)) == ("shared_prefix", "shared_prefix")
    line = plan_of(on_gpu, policy).describe(None)
    assert "layout padded (fast_path.layout=auto: the device's measured choice" in line


def test_a_blocked_layout_runs_padded_and_the_log_says_where_and_why():
    """Gradient checkpointing keeps the update padded (transformers recomputes the layers outside the packed
    attention, and drops the KV cache the shared prefix needs) while the no-grad passes, which pause it, keep the
    layout; the run's line says so with the reason."""
    from tests.models.test_response_forward import tiny_qwen2

    model = tiny_qwen2()
    model.gradient_checkpointing_enable()
    for layout in ("shared_prefix", "packed"):
        path = plan_of(FastPath(layout), model)
        assert layouts(path) == (layout, "padded")
        assert path.describe(None).startswith(
            f"update path: layout padded in the update ({layout}: gradient checkpointing"
        ) and f"), {layout} in the statistics and reference passes;" in path.describe(None)
    assert layouts(plan_of(FastPath("padded"), model)) == ("padded", "padded")


@pytest.mark.parametrize("value", ["shared", "fused", True, None])
def test_an_unknown_layout_is_refused_with_the_choices(value):
    choices = "must be auto or one of padded, shared_prefix, packed"
    with pytest.raises(ValueError, match=rf"fast_path\.layout={value!r} {choices}"):
        FastPath.from_node({"layout": value})


def test_an_unknown_key_is_refused_by_its_name():
    with pytest.raises(ValueError, match=r"fast_path\.fused_stats is not a setting") as error:
        FastPath.from_node({"fused_stats": True})
    assert "fused_statistics" in str(error.value)  # the message lists the settings there are


@pytest.mark.parametrize("value", [1, 0, "true", "no", None, 1.0])
@pytest.mark.parametrize("key", ["fused_statistics", "pack"])
def test_a_non_boolean_is_refused_by_its_name(key, value):
    with pytest.raises(ValueError, match=rf"fast_path\.{key}={value!r} must be true or false"):
        FastPath.from_node({key: value})


def test_the_composed_node_is_checked_at_build_time(tiny_cfg):
    """The command line gives ints and strings as such: `fast_path.pack=1` fails before any model is loaded."""
    assert FastPath.from_node(tiny_cfg().fast_path) == FastPath(layout_auto=True)  # auto, on the CPU
    with pytest.raises(ValueError, match=r"fast_path\.pack=1 must be true or false"):
        build_components(tiny_cfg("fast_path.pack=1"))


# ------------------------------------------------------------------------------------------------- end to end
class Capture(L.Callback):
    """The step's TrainBatch as the update received it, the update's result and the policy's weights before and after
    the step."""

    def on_train_start(self, trainer, module) -> None:
        update = module.update_step
        self.before = copy.deepcopy(module.policy.state_dict())

        def spy(train, timer):
            self.train = train
            lr, self.result = update(train, timer)
            return lr, self.result

        module.update_step = spy

    def on_train_end(self, trainer, module) -> None:
        self.after = copy.deepcopy(module.policy.state_dict())


def fit_one_step(cfg, caplog):
    """(module, trainer, capture, the run's "update path:" lines)."""
    caplog.clear()
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    capture = Capture()
    trainer.callbacks.append(capture)
    trainer.fit(module, datamodule=datamodule)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "tokenrl.step.update" and r.getMessage().startswith("update path:")
    ]
    return module, trainer, capture, lines


def test_every_shortcut_on_gives_the_weights_of_every_shortcut_off(tiny_cfg, caplog):
    """ICT from step 0 (JS over whole groups of G = 8 rows) under token-mean (the divisor counts the selected tokens),
    32 rows in micro-batches of 12 rows (the fused update's hold whole groups, the separate path's split them): with the
    defaults the step encodes each prompt once, takes π_old's statistics from the update's forward and cuts
    micro-batches by length; with every switch off it takes none of them. The same rollouts give the same weights
    after the (SGD) step."""
    caplog.set_level(logging.INFO, logger="tokenrl.step.update")
    setting = [*ICT, *SGD, "algorithm.aggregation=token-mean", "algorithm.micro_batch_size=12"]
    on_module, on_trainer, on, on_lines = fit_one_step(tiny_cfg(*setting), caplog)
    off_module, off_trainer, off, off_lines = fit_one_step(tiny_cfg(*setting, *ALL_OFF), caplog)

    assert on_lines == [
        "update path: layout shared_prefix (fast_path.layout=auto: the device's measured choice, docs/algorithms.md "
        "§12.4); statistics from the update's forward; micro-batches by length, cut to their own widths"
    ]
    assert off_lines == [
        "update path: layout padded; statistics from a separate pass (fast_path.fused_statistics=false); "
        "micro-batches in row order, full width"
    ]
    assert float(on_trainer.callback_metrics["train/fused_statistics"]) == 1.0
    assert float(off_trainer.callback_metrics["train/fused_statistics"]) == 0.0
    assert on.result.fused_statistics and not off.result.fused_statistics  # fused: from the update's forward
    assert on.train.size == 32 and on_module.cfg.batch.micro_batch_size == 12 and on_module.cfg.uses_reference

    # the same step: the same rollouts from the same weights, ICT really selecting
    assert torch.equal(on.train.rollouts.response_ids, off.train.rollouts.response_ids)
    assert torch.equal(on.train.advantages, off.train.advantages) and on.train.advantages.abs().sum() > 0
    for name, weight in on.before.items():
        assert torch.equal(weight, off.before[name]), name
    assert float(on_trainer.callback_metrics["select/fraction"]) < 0.5
    for key in ("train/loss", "select/fraction", "train/entropy"):
        assert float(on_trainer.callback_metrics[key]) == pytest.approx(
            float(off_trainer.callback_metrics[key]), rel=1e-4, abs=1e-6
        ), key
    moved = 0.0
    for name, weight in on.after.items():
        torch.testing.assert_close(weight, off.after[name], rtol=0, atol=1e-5, msg=name)
        moved = max(moved, float((weight - on.before[name]).abs().max()))
    assert moved > 1e-3  # the step really moved the weights


def test_two_mini_batches_take_statistics_from_a_separate_pass(tiny_cfg, caplog):
    """Every optimizer step after the first needs π_old's statistics: the run says why and logs 0."""
    caplog.set_level(logging.INFO, logger="tokenrl.step.update")
    module, trainer, capture, lines = fit_one_step(tiny_cfg(*ICT, "algorithm.mini_batches=2"), caplog)
    assert len(lines) == 1
    assert lines[0].startswith(
        "update path: layout shared_prefix (fast_path.layout=auto: the device's measured choice, docs/algorithms.md "
        "§12.4); statistics from a separate pass (algorithm.ppo_epochs "
        "× mini_batches = 2 optimizer steps"
    )
    assert lines[0].endswith("micro-batches by length, cut to their own widths")
    assert float(trainer.callback_metrics["train/fused_statistics"]) == 0.0
    assert not capture.result.fused_statistics and module.run_state.optimizer_steps == 2


def test_a_token_budget_gives_the_weights_of_the_row_cut(tiny_cfg, caplog):
    """`algorithm.micro_batch_tokens`: the same step as `test_every_shortcut_on_…`'s, its micro-batches cut by
    tokens (several of them, each within the budget unless a group alone exceeds it) instead of 12 rows; the run says
    so, and the weights after the step are the row cut's."""
    caplog.set_level(logging.INFO, logger="tokenrl.step.update")
    setting = [*ICT, *SGD, "algorithm.aggregation=token-mean"]
    rows_module, _, by_rows, _ = fit_one_step(tiny_cfg(*setting, "algorithm.micro_batch_size=12"), caplog)
    budget = 250
    cfg = tiny_cfg(*setting, f"algorithm.micro_batch_tokens={budget}")
    module, trainer, by_tokens, lines = fit_one_step(cfg, caplog)
    assert len(lines) == 1 and lines[0].endswith(
        f"micro-batches by length, cut to their own widths, at most {budget} tokens each (algorithm.micro_batch_tokens)"
    )
    cut = module.passes.plan.cut(with_grad=True)
    rollouts = by_tokens.train.rollouts
    parts = cut(rollouts, torch.arange(len(rollouts.texts)), True)
    assert len(parts) > 1 and all(cut.tokens(rollouts, part) <= budget for part in parts)
    assert float(trainer.callback_metrics["train/fused_statistics"]) == 1.0
    assert torch.equal(rollouts.response_ids, by_rows.train.rollouts.response_ids)
    for name, weight in by_tokens.after.items():
        torch.testing.assert_close(weight, by_rows.after[name], rtol=0, atol=1e-5, msg=name)
