"""Micro-batch invariance of every method (issue #23 §4): splitting a mini-batch into one micro-batch or several —
and a rollout batch over one process or two DDP ranks — gives the same selection, loss and gradient. Peers shipped
exactly this bug (a statistic or a count taken per micro-batch: verl #7829's KL-Cov, AReaL #1730's M2PO).

Every preset of configs/method/ (read from the folder: a new preset is covered without editing this file), with
tests/helpers/varied.py's `ACTS` (the overrides without which a preset does nothing on the tiny model), is composed
through Hydra onto the tiny setting and replays one real rollout step — rollouts sampled once per module by the real
Trainer from the tiny random Qwen2, with an engine that disagrees with the trainer so that IcePop masks — through the
real update path: the module's own `PolicyPasses` (statistics, reference and update forwards in the shared-prefix,
trimmed layouts; the statistics pass in micro-batches of the same size), its selector and `AlgorithmConfig`,
`ppo_update` with micro-batches by length, gradient clipping. Only the backend is plain (no Trainer:
tests/step/test_update.py shows it equals the module's), and the optimizer is SGD at lr 1: Adam's g/(|g| + ε) turns a
1e-9 rounding difference on a 7e-8 gradient entry into a 2e-5 weight difference, which the next step's gradient would
inherit. Each method runs with `algorithm.micro_batch_size` = the whole batch (one micro-batch per mini-batch) and = 3
(several, groups of 8 cut across them, the last one short), in two regimes:

* `moving`: at least 2 mini-batches (the preset's count where it has more) — from the second optimizer step on
  π_θ ≠ π_old (asserted: log-ratios moved by > 1e-2; 0.25–1.4 nats here), so the ratio, the clip, DPPO's drop, SAPO's
  gate, GSPO's sequence ratio, KL-Cov's drift penalty and the `stats_policy=current` re-ranking (entropy20, STAPO,
  Clip-Cov, KL-Cov) all act;
* `on_policy`: one epoch of one mini-batch — the fused-statistics path where it is admitted (docs/algorithms.md §12.2:
  row-local selectors then choose per micro-batch, which must equal the mini-batch's choice), the separate pass where
  not (then one micro-batch may take the fused path and several the separate one: they must agree too).

Compared between the two splits, per optimizer step: every selection (token weights exactly; per-token ε, KL weights,
advantages and drift coefficients to float rounding; the fused path's per-micro-batch choices stitched over the
batch), the loss (the micro-batches' shares summed), the accumulated gradient before clipping, and the weights after the
update. No method here is defined per micro-batch: verl's Clip-Cov / KL-Cov score each micro-batch, tokenrl's the
mini-batch on this rank (docs/algorithms.md §11.6), so they must be — and are — micro-batch invariant; see `PER_RANK`
for what that means over ranks.

Tolerances: float32 (the update's log-softmax runs in float32 whatever the model's dtype, `PolicyPasses.update_forward`,
so there is no float64 path end to end). The splits differ only in the order of float32 sums and the width each forward
pads to: measured, the loss agrees to ≤ 1.4e-7 of max(|loss|, mean |Â|) (on-policy the loss cancels to ~1e-8, Σ Â = 0 in
a group, so its rounding is relative to a token's term |Â|) and the gradient to ≤ 1e-6 of its largest entry.
LOSS_RTOL = 1e-6 and GRAD_RTOL = 1e-5 leave a margin of 7–10×; an injected per-micro-batch selection (verl #7829's bug)
breaks the selection, loss or gradient of KL-Cov, Clip-Cov, STAPO, entropy20 and GTPO by far more (checked while
writing this test), and leaves ICT and uniform — row-local on whole-group statistics — rightly unchanged.

The two-rank counterpart (`test_two_ranks_equal_one_process`, marked slow: two launches of tests/helpers/ddp_methods.py,
about a minute) runs every method under Lightning DDP over gloo against one process.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from tests.conftest import TINY, compose_config, once_per_run
from tests.helpers.forked_cli import forked_python
from tests.helpers.varied import ACTS, METHODS, disagree, fit_recording
from tests.step.test_update import CaptureUpdate
from tokenrl.records.selection import Selection
from tokenrl.rollout.dynamic_sampling import ScoredRollouts
from tokenrl.run.training import build_components
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import Backend, UpdateRun, fused_update, ppo_update
from tokenrl.utils import derived_seed

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SETTING = [
    "task.verifier=tests.helpers.varied:share_reward",
    "task.train_size=64",
    "task.test_size=8",
    "total_steps=1",
    "samples.every_n_steps=0",
    "selector_warmup_steps=0",
    "algorithm.kl_coef=0.01",
]
OPTIMIZER = [
    "algorithm.optimizer._target_=torch.optim.SGD",
    "~algorithm.optimizer.betas",
    "~algorithm.optimizer.weight_decay",
    "algorithm.optimizer.lr=1.0",
]
ROWS = 32  # model=tiny: 4 prompts × G 8
ONE, SEVERAL = ROWS, 3  # micro_batch_size: one micro-batch per mini-batch vs several
LOSS_RTOL, GRAD_RTOL = 1e-6, 1e-5
FIELDS = ("clip_low", "clip_high", "kl_weights", "advantages", "drift_coef")


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """One real rollout step of the tiny model under the Trainer: its rollouts (with an engine that disagrees with
    the trainer, tests/helpers/varied.py, so that IcePop masks), scores and rewards, and the policy's weights before
    the update."""
    cfg = compose_config(TINY + SETTING, output_dir=tmp_path_factory.mktemp("step"))
    capture = CaptureUpdate()
    fit_recording(cfg, capture)
    assert capture.train.size == ROWS and capture.train.advantages.abs().min() > 0  # every row carries a signal
    capture.train = dataclasses.replace(capture.train, rollouts=disagree(capture.train.rollouts, seed=1))
    return capture


@dataclass
class Record:
    """What one replay saw: per optimizer step the selections, the loss (its micro-batches' shares summed) and the
    accumulated gradient before clipping; the weights after; the largest |log π_θ − log π_old| at the second step."""

    selections: list[Selection] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    micro_batches: list[int] = field(default_factory=list)
    weights: torch.Tensor | None = None
    first_epoch: dict[str, torch.Tensor] = field(default_factory=dict)
    moved: float = 0.0
    advantages: torch.Tensor | None = None
    fused: bool = False


@functools.cache
def composed(method: str) -> DictConfig:
    """`method`'s preset composed through Hydra onto the tiny setting (once per method: composition is most of a
    replay's time)."""
    return compose_config(TINY + SETTING + OPTIMIZER + [f"method={method}", *ACTS.get(method, [])])


def method_config(method: str, regime: str, micro: int) -> DictConfig:
    """The composed preset in `regime` with `micro` rows per micro-batch (set on the composed config, as the
    command-line overrides `algorithm.micro_batch_size=…`, `algorithm.mini_batches=…` would)."""
    cfg = copy.deepcopy(composed(method))
    cfg.algorithm.micro_batch_size = micro
    if regime == "moving":
        cfg.algorithm.mini_batches = max(int(cfg.algorithm.mini_batches), 2)
    else:
        cfg.algorithm.mini_batches = cfg.algorithm.ppo_epochs = 1
    return cfg


def replay(step: CaptureUpdate, method: str, regime: str, micro: int) -> Record:
    """The captured step's update under `method`'s composed preset with `micro` rows per micro-batch (module
    docstring)."""
    cfg = method_config(method, regime, micro)
    module, _, _ = build_components(cfg)
    module.configure_model()
    module.policy.load_state_dict(step.before)
    policy, passes, algorithm = module.policy, module.passes, module.cfg
    rollouts = step.train.rollouts
    fused = passes.plan.statistics_blocker(algorithm, module.selector, rollouts) is None  # `UpdatePath`'s choice
    scored = ScoredRollouts(rollouts, step.train.scores, step.train.rewards, step.train.forks)
    train = TrainBatch.assemble(0, scored, algorithm, passes)
    old = None if fused else passes.statistics(rollouts)
    optimizer = module.optimizer_factory([p for p in policy.parameters() if p.requires_grad])
    record = Record(fused=fused, advantages=train.advantages)
    pending: list[torch.Tensor] = []

    def backward(loss: torch.Tensor, last: bool) -> None:
        pending.append(loss.detach())
        loss.backward()

    @torch.no_grad()
    def scale_gradients(factor: float) -> None:
        for parameter in policy.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(factor)

    def optimizer_step() -> None:
        # the separate path's micro-batch losses are shares of the mini-batch's (already divided by its normaliser)
        record.losses.append(float(torch.stack(pending).double().sum()))
        record.micro_batches.append(len(pending))
        pending.clear()
        record.grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]).clone())
        torch.nn.utils.clip_grad_norm_(policy.parameters(), algorithm.schedule.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        if len(record.grads) == 1 and not fused:
            moved = (passes.statistics(rollouts, with_js=False).logprobs - old.logprobs).abs()
            record.moved = float(moved[rollouts.response_mask.bool()].max())

    select = module.selector.select

    def recording_select(view):
        selection = select(view)
        record.selections.append(selection)
        return selection

    module.selector.select = recording_select
    backend = Backend(
        forward=passes.update_forward,
        micro_batches=passes.plan.cut(with_grad=True),
        backward=backward,
        scale_gradients=scale_gradients,
        optimizer_step=optimizer_step,
        current_stats=partial(passes.statistics, with_js=False),
        reduce_normalizer=lambda local: local,
    )
    shuffle = torch.Generator().manual_seed(derived_seed(cfg.seed, "shuffle", 0))
    loss = dataclasses.replace(algorithm.loss, entropy_coef=module.entropy_control.alpha)
    run = UpdateRun(module.selector, dataclasses.replace(algorithm, loss=loss), shuffle, module.with_js)
    result = fused_update(train, run, backend) if fused else ppo_update(train, old, run, backend)
    if fused:  # it back-propagates plain sums and divides once afterwards (update.py: fused_update): its metric
        record.losses = [result.metrics["loss"]]
    record.first_epoch = {"weights": result.first_epoch_weights, **result.first_epoch_shaping}
    record.weights = torch.cat([p.detach().flatten() for p in policy.parameters()])
    return record


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def assert_same(one: Record, several: Record, scale: float) -> None:
    assert len(several.grads) == len(one.grads)
    assert all(n == 1 for n in one.micro_batches) and any(n > 1 for n in several.micro_batches)
    assert one.first_epoch.keys() == several.first_epoch.keys()
    assert torch.equal(one.first_epoch["weights"], several.first_epoch["weights"])
    for name, value in one.first_epoch.items():
        torch.testing.assert_close(several.first_epoch[name], value, rtol=1e-6, atol=1e-7, msg=name)
    separate = not (one.fused or several.fused)  # the fused path selects per micro-batch: compare its whole batch
    assert not separate or len(several.selections) == len(one.selections)
    for index, (a, b) in enumerate(zip(one.selections, several.selections) if separate else []):
        assert a.normalizer == b.normalizer
        assert torch.equal(a.weights, b.weights), f"selection of optimizer step {index}"
        for name in FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7, msg=f"{name} of optimizer step {index}")
    for index, (a, b) in enumerate(zip(one.losses, several.losses)):
        assert abs(a - b) <= LOSS_RTOL * max(abs(a), scale), f"loss of optimizer step {index}: {a} vs {b}"
    for index, (a, b) in enumerate(zip(one.grads, several.grads)):
        assert relative(b, a) < GRAD_RTOL, f"gradient of optimizer step {index}: {relative(b, a):.2e}"
    assert relative(several.weights, one.weights) < GRAD_RTOL


@pytest.mark.parametrize("regime", ["moving", "on_policy"])
@pytest.mark.parametrize("method", METHODS)
def test_one_or_several_micro_batches_give_the_same_update(step, method, regime):
    one, several = replay(step, method, regime, ONE), replay(step, method, regime, SEVERAL)
    if regime == "moving":
        assert len(one.grads) >= 2 and one.moved > 1e-2  # the second optimizer step sees a moved policy
    # on-policy the loss cancels to ~0 (Σ Â = 0 in a group): its rounding is relative to a token's term, |Â|
    assert_same(one, several, scale=float(one.advantages.abs().mean()))


# ------------------------------------------------------------------------------------------- two ranks vs one
# Methods whose selection is defined on this rank's mini-batch, not the mini-batch of all ranks: Clip-Cov and KL-Cov
# score Cov_t with means over this rank's tokens and act on ⌊r·N⌋ of them (docs/algorithms.md §11.6; verl does the
# same per micro-batch: there it depends on the micro-batch, here only on the rank count), and STAPO's entropy quantile
# is per rank under DDP (docs/algorithms.md §9, item 6). For them two ranks equal one process whose selector chooses on
# each rank's rows by itself. Every other method's selection is row-local (ICT, random, Archer, GTPO: groups never span
# ranks) or gathered over ranks (entropy20's `scope=global`), and two ranks equal one process as it is.
PER_RANK = ("clip_cov", "kl_cov", "stapo")


@pytest.fixture(scope="session")
def ranks(tmp_path_factory, worker_id) -> Path:
    """Every method's step under two DDP ranks and on one process, `PER_RANK` methods also choosing per rank's rows
    (tests/helpers/ddp_methods.py, forked: tests/helpers/forked_cli.py), once per test run: the folder of their
    records."""

    def launch(out: Path) -> Path:
        one_process = [str(out / "one"), "1", "--per-rank", "2", ",".join(PER_RANK), *METHODS]
        for argv in (one_process, [str(out / "two"), "2", *METHODS]):
            done = forked_python(["tests/helpers/ddp_methods.py", *argv], timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
        return out

    return once_per_run(tmp_path_factory, worker_id, "ranks", launch)


def load(folder: Path) -> list[dict]:
    """The records of a run: one per rank (tests/helpers/ddp_methods.py)."""
    return [torch.load(path, weights_only=True) for path in sorted(folder.glob("rank*.pt"))]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_two_ranks_equal_one_process(ranks, method):
    """Lightning DDP over gloo, 2 ranks × 16 rows vs 1 process × 32 rows, micro-batches of 3, two PPO epochs of one
    mini-batch (the second sees a moved policy): each rank's first-epoch selection is the one process's on those rows,
    and the weights after the step agree to float32 rounding (the same bound as one vs several micro-batches). For
    `PER_RANK` methods the one process chooses on each rank's rows by itself."""
    [one] = load(ranks / "one" / (f"{method}.per_rank" if method in PER_RANK else method))
    two = load(ranks / "two" / method)
    assert one["optimizer_steps"] == two[0]["optimizer_steps"] == two[1]["optimizer_steps"] == 2
    assert torch.equal(torch.cat([two[0]["rows"], two[1]["rows"]]), one["rows"])
    for rank in two:
        assert rank["selection"].keys() == one["selection"].keys()
        for name, value in rank["selection"].items():
            mine = one["selection"][name][rank["rows"]][:, : value.shape[1]]  # a rank pads to its own longest response
            assert torch.equal(mine, value), f"{name} of rows {rank['rows'][0]}…"
    moved = 0.0
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two[0]["weights"][name], weight, rtol=GRAD_RTOL, atol=GRAD_RTOL, msg=name)
        moved = max(moved, float((weight - one["initial"][name]).abs().max()))
    assert moved > 1e-3  # the step changed the weights (Dr. GRPO: its smallest step, 5e-3)


@pytest.mark.slow
def test_kl_cov_on_two_ranks_penalises_per_rank(ranks):
    """The per-rank scope is real: KL-Cov's top 5% by Cov_t on each rank's 16 rows is not the top 5% of all 32 rows
    (each rank's own means and count), and the steps differ."""
    [plain] = load(ranks / "one" / "kl_cov")
    two = load(ranks / "two" / "kl_cov")
    drift = [
        plain["selection"]["drift_coef"][rank["rows"]][:, : rank["selection"]["drift_coef"].shape[1]] for rank in two
    ]
    assert any(not torch.equal(mine, rank["selection"]["drift_coef"]) for mine, rank in zip(drift, two))
    assert max(float((two[0]["weights"][name] - w).abs().max()) for name, w in plain["weights"].items()) > 1e-4
