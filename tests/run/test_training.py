"""End to end with the real Lightning Trainer and a tiny real model: fit, on-policy proof, resume."""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.helpers.crash import Crash, CrashAfter
from tokenrl.run.training import build_components, run

LEARNABLE = ["task.verifier=tests.helpers.rewards:length_reward", "total_steps=3"]


def fingerprint(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in module.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


class Recorder(L.Callback):
    """Records weights at every generate call and after every training step; keeps the first rollouts."""

    def __init__(self) -> None:
        self.at_generate: list[tuple[int, str]] = []
        self.after_step: list[str] = []
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.first = None

    def on_train_start(self, trainer, module) -> None:
        self.initial = fingerprint(module.policy)
        generate = module.engine.generate

        def spy(prompt_ids, params, seed):
            self.at_generate.append((module.run_state.rollout_step, fingerprint(module.policy)))
            batch = generate(prompt_ids, params, seed)
            self.first = self.first or batch
            return batch

        module.engine.generate = spy

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.after_step.append(fingerprint(module.policy))
        self.losses.append(float(trainer.callback_metrics["train/loss"]))
        self.lrs.append(float(trainer.callback_metrics["train/lr"]))


def fit(cfg, *callbacks, ckpt_path=None):
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    trainer.callbacks.extend(callbacks)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return module, trainer


def test_three_step_fit_raises_the_objective_and_logs(tiny_cfg):
    recorder = Recorder()
    module, trainer = fit(tiny_cfg(*LEARNABLE), recorder)
    assert module.run_state.rollout_step == 3 and module.run_state.optimizer_steps == 3
    metrics = trainer.callback_metrics
    for key in (
        "train/reward",
        "train/entropy",
        "train/kl",
        "train/clip_frac",
        "train/response_len",
        "time/generate",
        "time/statistics",
        "time/update",
        "time/sync",
        "select/fraction",
    ):
        assert torch.isfinite(metrics[key]), key
    assert float(metrics["train/logprob_gap_max"]) < 1e-4
    # Σ_i Â_i · mean_t log π(o_i,t) on the first batch: GRPO's ascent direction must have raised it
    first = recorder.first
    from tests.helpers.rewards import length_reward
    from tokenrl.algorithms.grpo import group_advantages
    from tokenrl.models.response_forward import response_logprobs

    rewards = torch.tensor([length_reward(t, "") for t in first.texts])
    adv = group_advantages(rewards, first.group_ids)
    assert adv.abs().sum() > 0
    resp = first.response_mask.float()
    after = (response_logprobs(module.policy, first, 1.0).detach() * resp).sum(1) / resp.sum(1)
    before = (first.sampling_logprobs * resp).sum(1) / resp.sum(1)
    assert float((adv * after).sum()) > float((adv * before).sum())


def test_rollouts_at_step_k_come_from_the_weights_after_update_k_minus_1(tiny_cfg):
    recorder = Recorder()
    fit(tiny_cfg(*LEARNABLE), recorder)
    steps = [step for step, _ in recorder.at_generate]
    assert steps == [0, 1, 2]
    expected = [recorder.initial] + recorder.after_step[:-1]
    assert [fp for _, fp in recorder.at_generate] == expected
    assert len(set(expected)) == 3  # the weights really changed between steps


def test_lr_warms_up_linearly_over_rollout_steps(tiny_cfg):
    cfg = tiny_cfg(*LEARNABLE, "algorithm.lr_warmup_steps=2", "algorithm.mini_batches=2")
    recorder = Recorder()
    module, _ = fit(cfg, recorder)
    lr = float(cfg.algorithm.optimizer.lr)
    assert recorder.lrs == pytest.approx([0.0, lr / 2, lr], rel=1e-6)  # lr · min(1, s / W), logged as float32
    assert module.run_state.optimizer_steps == 6  # the schedule steps per rollout, not per update
    assert recorder.after_step[0] == recorder.initial  # lr 0 (weight decay 0): nothing moved
    assert recorder.after_step[1] != recorder.after_step[0]


def test_overlong_shaping_lowers_the_reward_by_the_length_penalty(tiny_cfg):
    from tokenrl.algorithms.dapo import overlong_penalty

    seen = []

    class FirstStep(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            seen.append(
                {
                    key: float(trainer.callback_metrics[key])
                    for key in ("train/reward", "train/score", "train/overlong_penalty")
                }
            )

    recorder = Recorder()
    fit(
        tiny_cfg(*LEARNABLE, "total_steps=1", "algorithm.overlong_buffer=12", "algorithm.overlong_penalty_factor=0.5"),
        recorder,
        FirstStep(),
    )
    lengths = recorder.first.response_mask.sum(1)
    expected = float(overlong_penalty(lengths, 12, 12, 0.5).mean())  # buffer = budget: −0.5 · |y| / 12
    assert expected < 0
    assert seen[0]["train/overlong_penalty"] == pytest.approx(expected, abs=1e-6)
    assert seen[0]["train/reward"] == pytest.approx(seen[0]["train/score"] + expected, abs=1e-6)


def test_bad_overlong_buffer_fails_at_start_up(tiny_cfg):
    from tokenrl.run.training import build_components

    with pytest.raises(ValueError, match=r"algorithm.overlong_buffer=13 must lie in \[0, rollout.max_new_tokens=12\]"):
        build_components(tiny_cfg("algorithm.overlong_buffer=13"))


@pytest.mark.parametrize("stats_policy", ["current", "old"])
def test_stapo_ranks_each_mini_batch_by_the_policy_of_its_choice(tiny_cfg, stats_policy):
    """Two mini-batches: the second is ranked by π_θ after the first update (`current`); with `old`, π_old's
    statistics rank the whole step once, before the first update."""
    import copy

    from tokenrl.step.fast_path import ForwardPlan
    from tokenrl.step.statistics import compute_token_stats

    calls = []

    class SpyOnSelection(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            select = module.selector.select

            def spy(view):
                calls.append((copy.deepcopy(module.policy.state_dict()), view.row_ids.clone(), view.stats))
                return select(view)

            module.selector.select = spy

    recorder = Recorder()
    module, _ = fit(
        tiny_cfg(
            *LEARNABLE,
            "total_steps=1",
            "selector=stapo",
            f"selector.stats_policy={stats_policy}",
            "algorithm.mini_batches=2",
            "samples.every_n_steps=0",
        ),
        SpyOnSelection(),
        recorder,
    )
    assert len(calls) == (2 if stats_policy == "current" else 1)
    if stats_policy == "old":
        assert calls[0][1].tolist() == list(range(recorder.first.response_ids.shape[0]))  # every row of the step
    policy = copy.deepcopy(module.policy)

    def stats_under(weights, rows):
        policy.load_state_dict(weights)
        return compute_token_stats(policy, recorder.first.rows(rows), ForwardPlan(1.0, 4, 64))

    old_weights = calls[0][0]
    for weights, rows, seen in calls:
        expected = stats_under(weights if stats_policy == "current" else old_weights, rows)
        assert torch.allclose(seen.entropy, expected.entropy, atol=1e-5)
        assert torch.allclose(seen.logprobs, expected.logprobs, atol=1e-5)
    if stats_policy == "current":
        moved = stats_under(calls[1][0], calls[1][1]).entropy - stats_under(old_weights, calls[1][1]).entropy
        assert moved.abs().max() > 1e-4  # the first update really changed the second batch's entropy


def test_ict_ranks_by_the_js_of_its_js_peers_setting(tiny_cfg):
    """`selector.js_peers=others` reaches the statistics pass: ICT ranks by the leave-one-out JS."""
    import copy

    from tokenrl.step.fast_path import ForwardPlan
    from tokenrl.step.statistics import compute_token_stats

    seen = []

    class SpyOnSelection(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            select = module.selector.select

            def spy(view):
                seen.append((copy.deepcopy(module.policy.state_dict()), view.row_ids.clone(), view.stats.js.clone()))
                return select(view)

            module.selector.select = spy

    recorder = Recorder()
    module, _ = fit(
        tiny_cfg(
            *LEARNABLE,
            "total_steps=1",
            "selector=ict",
            "selector_warmup_steps=0",
            "selector.js_peers=others",
            "samples.every_n_steps=0",
        ),
        SpyOnSelection(),
        recorder,
    )
    # the fused path selects once per micro-batch of whole groups, all before the one optimizer step
    weights = seen[0][0]
    assert all(
        state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in state) for state, _, _ in seen
    )
    js = torch.zeros(recorder.first.response_ids.shape)
    for _, rows, part in seen:
        js[rows] = part
    assert sorted(torch.cat([rows for _, rows, _ in seen]).tolist()) == list(range(js.shape[0]))
    policy = copy.deepcopy(module.policy)
    policy.load_state_dict(weights)
    expected = {
        peers: compute_token_stats(policy, recorder.first, ForwardPlan(1.0, 4, 64, True, peers)).js
        for peers in ("others", "all")
    }
    assert torch.allclose(js, expected["others"], atol=1e-6)
    assert not torch.allclose(js, expected["all"], atol=1e-3)


def test_current_policy_statistics_cannot_rank_within_groups():
    from tokenrl.selectors import GTPOSelector
    from tokenrl.selectors.base import TokenSelector

    class RanksByJS(TokenSelector):
        requires = frozenset({"js"})

        def mask(self, batch):
            return batch.response_mask

    with pytest.raises(ValueError, match="stats_policy=current cannot be used with RanksByJS: it compares each row"):
        RanksByJS(stats_policy="current")
    with pytest.raises(ValueError, match="stats_policy=current cannot be used with gtpo"):  # entropy shares of groups
        GTPOSelector(stats_policy="current")
    with pytest.raises(ValueError, match="selector.stats_policy='newest': must be one of old, current"):
        RanksByJS(stats_policy="newest")


def test_negative_warmup_is_named(tiny_cfg):
    with pytest.raises(ValueError, match=r"algorithm.lr_warmup_steps=-1 must be >= 0"):
        fit(tiny_cfg(*LEARNABLE, "algorithm.lr_warmup_steps=-1"))


@pytest.mark.parametrize(
    "extra",
    [  # the full suite's run resumes 4 optimizer steps per rollout step, and the lr mid-warm-up (2/4 of it at step 3)
        [],
        pytest.param(
            ["algorithm.mini_batches=2", "algorithm.ppo_epochs=2", "algorithm.lr_warmup_steps=4"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_resume_from_step_2_checkpoint_reproduces_step_3(tiny_cfg, tmp_path, extra):
    overrides = LEARNABLE + ["checkpoint.enabled=true", "checkpoint.every_n_steps=1"] + extra
    straight = Recorder()
    fit(tiny_cfg(*overrides), straight)

    first_run = tiny_cfg(*overrides, f"paths.output_dir={tmp_path / 'interrupted'}")
    with pytest.raises(Crash):
        fit(first_run, CrashAfter(2))
    last = tmp_path / "interrupted" / "checkpoints" / "last.ckpt"
    assert last.is_file()

    resumed_rec = Recorder()
    resumed, _ = fit(tiny_cfg(*overrides, f"paths.output_dir={tmp_path / 'resumed'}"), resumed_rec, ckpt_path=str(last))
    assert resumed.run_state.rollout_step == 3 and len(resumed_rec.losses) == 1
    assert resumed_rec.losses[0] == pytest.approx(straight.losses[2], abs=1e-7)
    assert resumed_rec.after_step[0] == straight.after_step[2]  # identical weights after step 3


class CopyLastCheckpoint(L.Callback):
    """Before each step, copies last.ckpt (the state after the previous step) to `folder/after<k>.ckpt`: what a
    copy taken then, or a kill during step k+1, leaves to resume from."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
        if last.is_file():
            shutil.copy(last, self.folder / f"after{module.run_state.rollout_step}.ckpt")


@pytest.mark.parametrize(
    "extra",
    [  # the plain run in the quick loop, with validation in the full suite; a dynamic-sampling run's resume is the
        # quick loop's (tests/run/test_preemption.py, tests/rollout/test_dynamic_sampling.py)
        pytest.param([], id="plain"),
        pytest.param(
            ["validation.every_n_steps=2", "validation.limit=4", "validation.n_samples=2", "validation.ks=[1,2]"],
            id="validation",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_resume_from_any_point_of_a_six_step_run_finishes_it_exactly(tiny_cfg, tmp_path, extra):
    """Resumed from a copy of last.ckpt after step 2 or 4, or from the best stepNNNN.ckpt, a 6-step run ends at
    step 6 with the uninterrupted run's rewards and weights (a resumed run used to stop after 6 − 2k steps)."""
    overrides = [
        "task.verifier=tests.helpers.rewards:length_reward",
        "total_steps=6",
        "checkpoint.enabled=true",
        "checkpoint.every_n_steps=1",
        *extra,
    ]
    copies = tmp_path / "copies"
    straight, _ = fit(tiny_cfg(*overrides, f"paths.output_dir={tmp_path / 'straight'}"), CopyLastCheckpoint(copies))
    assert straight.run_state.rollout_step == 6 and len(straight.run_state.reward_history) == 6
    best = next((tmp_path / "straight" / "checkpoints").glob("step*.ckpt"))
    points = [copies / "after2.ckpt", copies / "after4.ckpt"]
    if torch.load(best, weights_only=True)["tokenrl"]["rollout_step"] < 6:
        points.append(best)
    for n, point in enumerate(points):
        resumed, _ = fit(tiny_cfg(*overrides, f"paths.output_dir={tmp_path / f'resumed{n}'}"), ckpt_path=str(point))
        assert resumed.run_state.rollout_step == 6, point.name
        assert resumed.run_state.reward_history == straight.run_state.reward_history, point.name
        assert fingerprint(resumed.policy) == fingerprint(straight.policy), point.name


def test_a_finished_run_resumed_with_a_larger_total_steps_trains_the_new_steps(tiny_cfg, tmp_path):
    """last.ckpt of a finished run (written at train end, its epoch complete) continues to the new total_steps."""
    base = ["total_steps=2", "checkpoint.enabled=true", "checkpoint.every_n_steps=10"]
    fit(tiny_cfg(*base, f"paths.output_dir={tmp_path / 'first'}"))
    longer = [*base[1:], "total_steps=4", f"paths.output_dir={tmp_path / 'longer'}"]
    resumed, _ = fit(tiny_cfg(*longer), ckpt_path=str(tmp_path / "first" / "checkpoints" / "last.ckpt"))
    straight, _ = fit(tiny_cfg(*longer[:-1], f"paths.output_dir={tmp_path / 'straight'}"))
    assert resumed.run_state.rollout_step == 4 and resumed.run_state.reward_history == straight.run_state.reward_history


def test_a_short_run_writes_one_last_checkpoint(tiny_cfg, tmp_path):
    """total_steps < checkpoint.every_n_steps: only last.ckpt, holding the final step (not also last-v1.ckpt)."""
    fit(tiny_cfg("total_steps=2", "checkpoint.enabled=true", "checkpoint.every_n_steps=10"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["tokenrl"]["rollout_step"] == 2


def test_run_writes_summary_and_logs(tiny_cfg, tmp_path):
    summary = run(tiny_cfg("total_steps=2", "logger=default", "checkpoint.enabled=true", "checkpoint.every_n_steps=5"))
    assert summary["rollout_steps"] == 2
    assert (tmp_path / "summary.json").is_file()
    assert (tmp_path / "csv" / "metrics.csv").is_file()
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)  # the final state is kept
    assert ckpt["tokenrl"]["rollout_step"] == 2
    assert any((tmp_path / "tensorboard").iterdir())


def test_a_raising_verifier_scores_zero_and_the_run_goes_on(tiny_cfg, caplog):
    summary = run(tiny_cfg("total_steps=2", "task.verifier=tests.helpers.rewards:raising"))
    assert summary["rollout_steps"] == 2 and summary["train/reward"] == 0.0
    assert "RuntimeError: this verifier always fails" in caplog.text


def test_lora_policy_trains_with_adapter_free_reference(tiny_cfg):
    summary = run(
        tiny_cfg(
            "total_steps=2",
            "model.lora={r:4,lora_alpha:8,target_modules:all-linear}",
            "algorithm.kl_coef=0.05",
            "task.verifier=tests.helpers.rewards:length_reward",
        )
    )
    assert summary["optimizer_steps"] == 2 and summary["train/kl"] > 0.0


def test_selector_needing_uncomputed_statistics_fails_at_start_up(tiny_cfg):
    from omegaconf import OmegaConf

    from tokenrl.algorithms.config import AlgorithmConfig
    from tokenrl.records.settings import ModelSettings, RolloutSettings
    from tokenrl.run.module import GRPOModule
    from tokenrl.run.module_spec import ModuleSpec
    from tokenrl.selectors.base import TokenSelector

    class NeedsFoo(TokenSelector):
        requires = frozenset({"foo"})

        def mask(self, batch):
            return batch.response_mask

    cfg = tiny_cfg()
    with pytest.raises(ValueError, match=r"needs statistics \['foo'\] that the statistics pass does not compute"):
        GRPOModule(
            ModuleSpec(
                ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True)),
                AlgorithmConfig.from_node(
                    OmegaConf.to_container(cfg.algorithm, resolve=True), cfg.rollout.max_new_tokens
                ),
                RolloutSettings.of(OmegaConf.to_container(cfg.rollout, resolve=True)),
                NeedsFoo(),
                tokenizer=None,
                optimizer=torch.optim.SGD,
            )
        )


def test_truncated_importance_sampling_is_plumbed_and_neutral_when_engines_agree(tiny_cfg):
    overrides = ("total_steps=1", "task.verifier=tests.helpers.rewards:length_reward")
    plain = run(tiny_cfg(*overrides))
    corrected = run(tiny_cfg(*overrides, "algorithm.tis_cap=2.0"))
    # the hf engine samples from the trainer's own weights: w = π_trainer / π_engine ≈ 1, never capped
    assert corrected["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert corrected["train/tis_capped_frac"] == 0.0
    assert corrected["train/loss"] == pytest.approx(plain["train/loss"], rel=1e-3, abs=1e-7)
    assert "train/tis_weight_mean" not in plain


def test_samples_record_tokens_statistics_and_each_selectors_choice(tiny_cfg, tmp_path):
    import json

    run(
        tiny_cfg(
            "total_steps=2",
            "selector=ict",
            "selector_warmup_steps=0",
            "samples.every_n_steps=1",
            "samples.rows=4",
            "rollout.max_new_tokens=30",
            "task.verifier=tests.helpers.rewards:length_reward",
        )
    )
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["step_0001.jsonl", "step_0002.jsonl"]
    for step in (1, 2):  # counted from 1, as the console and metrics.csv count
        records = [
            json.loads(line) for line in (tmp_path / "samples" / f"step_{step:04d}.jsonl").read_text().splitlines()
        ]
        assert [r["row"] for r in records] == [0, 1, 2, 3] and {r["step"] for r in records} == {step}
        for record in records:
            n = len(record["tokens"])
            assert n == len(record["entropy"]) == len(record["js"]) == len(record["updated"]) > 0
            assert set(record["would_select"]) == {"ict", "entropy20", "stapo"}
            # this run's selector is ICT with the paper defaults: what it updated is what the reference ICT picks
            assert record["updated"] == record["would_select"]["ict"]
            assert sum(record["updated"]) == math.ceil(0.1 * n)


def test_a_reference_selection_at_another_ratio_than_the_runs_is_named_by_it(tiny_cfg, tmp_path):
    import json

    run(
        tiny_cfg(
            "total_steps=1",
            "selector=ict",
            "selector_warmup_steps=0",
            "selector_ratio=0.3",
            "samples.every_n_steps=1",
            "samples.rows=2",
            "task.verifier=tests.helpers.rewards:length_reward",
        )
    )
    record = json.loads((tmp_path / "samples" / "step_0001.jsonl").read_text().splitlines()[0])
    assert set(record["would_select"]) == {"ict@0.1", "entropy20", "stapo"}  # the reference ICT, not the run's 0.3
    assert sum(record["would_select"]["ict@0.1"]) == math.ceil(0.1 * len(record["tokens"]))
