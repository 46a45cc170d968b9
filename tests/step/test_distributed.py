"""Two real processes (Lightning DDP or FSDP, gloo, CPU): global selection and loss normalisers equal one process
on the concatenated batch; a whole step under DDP equals one process and all-reduces once per optimizer step; a whole
step under FSDP, with gradient clipping, equals one process; the ddp trainer preset starts and trains a step."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, compose_config, once_per_run
from tests.helpers.ddp_selection import full_batch, select
from tests.helpers.forked_cli import forked_python, forked_spawn

pytestmark = pytest.mark.slow  # multi-process runs (README: `-m "not slow"` is the quick loop)


def test_global_scope_on_two_ranks_equals_one_process_on_the_whole_batch(tmp_path):
    done = forked_python(["tests/helpers/ddp_selection.py", str(tmp_path)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    B = full_batch()[1].shape[0]
    single = select(torch.arange(B), 0, lambda t: [t])
    for name in ("ict_global", "ict_sequence", "entropy20_global"):
        assert torch.equal(torch.cat([ranks[0][name], ranks[1][name]]), single[name]), name
    for agg in ("token-mean", "seq-mean-token-mean"):
        key = f"normalizer_{agg}"
        assert torch.equal(ranks[0][key], single[key]) and torch.equal(ranks[1][key], single[key]), key
    # selecting on each half alone (a rank-local threshold) gives a different answer on this batch,
    # so the equality above really exercises the cross-rank gather
    halves = [select(rows, 0, lambda t: [t]) for rows in torch.arange(B).tensor_split(2)]
    for name in ("ict_global", "entropy20_global"):
        assert not torch.equal(torch.cat([halves[0][name], halves[1][name]]), single[name]), name


def test_ddp_preset_trains_on_two_cpu_processes_with_dynamic_sampling(tmp_path):
    """Two ranks train with dynamic sampling and ICT's global scope, and run the same number of generation rounds (or
    the run hangs). Without dynamic sampling the doctor's DDP check trains the preset the same way (two steps over two
    CPU processes, test_doctor.py), and a DDP multirun job does (test_fresh_process_launcher.py)."""
    done = forked_python(
        [
            "train.py",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
            "model=tiny",
            "selector=ict",
            "selector.scope=global",
            "selector_warmup_steps=0",
            "total_steps=2",
            "logger=csv",
            "checkpoint.enabled=false",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}",
            "algorithm.filter_groups=acc",
            "algorithm.gen_prompts_per_step=2",
            "task.verifier=tests.helpers.rewards:odd_answers_unsolvable",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"rollout_steps": 2' in (tmp_path / "train.log").read_text()
    assert '"train/filled_groups": 0.0' in (tmp_path / "train.log").read_text()


def test_sigterm_to_rank_0_stops_both_ranks_at_the_same_safe_point_with_a_checkpoint(tmp_path):
    """Under the DDP subprocess launcher only rank 0 gets the signal; both ranks stop (none hangs in a collective)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "train.py",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
            "model=tiny",
            "total_steps=6",
            "logger=none",
            "checkpoint.enabled=true",
            "checkpoint.every_n_steps=1",
            "validation.every_n_steps=0",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in process.stdout:
        if "step 2/6 |" in line:
            break
    process.send_signal(signal.SIGTERM)
    output = process.stdout.read()
    process.wait(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert output.count("stopped by SIGTERM") == 1  # rank 0 says it once
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["tokenrl"]
    assert 2 <= state["rollout_step"] < 6


def _fsdp_fit(*runs: list) -> list[dict]:
    """tests/helpers/fsdp_fit.py: each run [OUT_DIR, CKPT_PATH or "-", OVERRIDE ...], one after another on the same
    two ranks; each run's result.pt."""
    done = forked_python(["tests/helpers/fsdp_fit.py", *[str(arg) for run in runs for arg in ("--then", *run)][1:]])
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(Path(run[0]) / "result.pt", weights_only=True) for run in runs]


def test_the_fsdp_preset_gathers_bf16_and_reduces_fp32_as_verl():
    from hydra.utils import instantiate

    precision = instantiate(compose_config(["trainer=fsdp"]).trainer.strategy.mixed_precision)
    assert (precision.param_dtype, precision.reduce_dtype, precision.buffer_dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
    )


def _bf16_generate_worker(rank: int, port: int, out: str) -> None:
    """One gloo rank: the tiny policy sharded with the preset's bf16 gathers, then the hf engine's `generate` (autocast
    off) and a no-grad log-prob pass inside `gathered_root`, as a step runs them."""
    import os
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.fsdp import ShardingStrategy

    from tests.helpers.tiny import tiny_policy
    from tokenrl.models.response_forward import response_logprobs
    from tokenrl.models.sharding import gathered_root, mixed_precision, shard
    from tokenrl.rollout.engine import SamplingParams
    from tokenrl.rollout.hf import HFEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    policy, tokenizer = tiny_policy()
    strategy = SimpleNamespace(
        kwargs={"use_orig_params": True},
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision_config=mixed_precision("bf16"),
        cpu_offload=None,
        root_device=torch.device("cpu"),
    )
    root = shard(policy, strategy)
    with gathered_root(root):
        batch = HFEngine(root, tokenizer).generate(
            [tokenizer("What is 2 + 3?")["input_ids"]],
            SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6),
            seed=0,
        )
        with torch.no_grad():
            scored = response_logprobs(root, batch, 1.0)
    torch.save({"sampled": batch.sampling_logprobs, "scored": scored.float(), "mask": batch.response_mask}, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_bf16_gathers_serve_generate_and_the_no_grad_passes(tmp_path):
    """The preset's bf16 all-gathers: FSDP casts only the root's inputs by default, and the passes inside
    `gathered_root` enter the decoder layers from the root's fp32 embeddings (with autocast off for the engine):
    "mat1 and mat2 must have the same dtype" on an H200 until every unit cast its own inputs."""
    from tests.export.test_export import free_port

    out = tmp_path / "bf16.pt"
    forked_spawn(_bf16_generate_worker, (free_port(), str(out)), nprocs=1)
    result = torch.load(out)
    mask = result["mask"].bool()
    assert mask.any() and torch.isfinite(result["scored"][mask]).all()
    # the engine's log-probs are the bf16 layers' own, as the no-grad pass computes them
    torch.testing.assert_close(result["sampled"][mask], result["scored"][mask], atol=0.05, rtol=0)


def test_fsdp_resume_continues_with_the_engine_at_the_restored_weights(tmp_path):
    """Lightning restores an FSDP checkpoint after on_fit_start, where the engine is built: the engine must follow
    (the collector refused the first step: "the engine missed a weight sync"). From a sharded checkpoint (the preset's:
    a folder, every rank its shard) and from a full one, both written after step 1 of a two-step run, the resumed run
    is the uninterrupted one, and the policy read back from either checkpoint in one process is the module's after
    step 1."""
    from tests.helpers.fsdp_fit import SNAPSHOTS
    from tokenrl.run.checkpointing import TEMPORARY_GLOB, policy_state_dict

    # one launch of the two ranks: the uninterrupted run (writing both step-1 checkpoints), then a resume from each
    straight, *resumes = _fsdp_fit(
        [tmp_path / "straight", "-", "--snapshot", "total_steps=2"],
        *(
            [
                tmp_path / f"{kind}_resumed",
                tmp_path / "straight" / path,
                "total_steps=2",
                f"trainer.strategy.state_dict_type={kind}",
            ]
            for kind, path in SNAPSHOTS.items()
        ),
    )
    for kind, path in SNAPSHOTS.items():
        saved_at = tmp_path / "straight" / path
        assert saved_at.is_dir() == (kind == "sharded") and not list(saved_at.parent.glob(TEMPORARY_GLOB))
        saved = policy_state_dict(saved_at)
        assert saved.keys() == straight["step1_weights"].keys(), kind
        assert all(torch.equal(saved[name], weight) for name, weight in straight["step1_weights"].items()), kind
    for kind, resumed in zip(SNAPSHOTS, resumes):
        assert resumed["rollout_step"] == 2 and resumed["reward_history"] == straight["reward_history"], kind
        for name, weight in straight["weights"].items():
            assert torch.equal(resumed["weights"][name], weight), (kind, name)
    assert any(
        not torch.equal(straight["weights"][name], weight)  # step 2 moved the weights after the snapshot
        for name, weight in straight["step1_weights"].items()
    )


def _one_step(out, world, strategy="ddp", *overrides):
    done = forked_python(["tests/helpers/ddp_step.py", str(out), str(world), strategy, *overrides])
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out / "result.pt")


CLIP = "algorithm.grad_clip=1.0"


@pytest.fixture(scope="session")
def one_process(tmp_path_factory, worker_id):
    """The step on one process (`CLIP`: its first gradient norm is above 1.0), the reference of the DDP and the FSDP
    step: computed once per test run, by whichever xdist worker asks first (the others wait on the lock)."""
    return once_per_run(tmp_path_factory, worker_id, "one_process", lambda out: _one_step(out, 1, "ddp", CLIP))


def test_ddp_step_all_reduces_once_per_optimizer_step_and_equals_one_process(tmp_path, one_process):
    """2 ranks × 8 rows in micro-batches of 2, 2 PPO epochs of one mini-batch (a rank-count-independent split):
    8 backward passes per rank, 2 optimizer steps. With `no_sync` on all but the last micro-batch of each optimizer
    step, exactly 2 of them all-reduce (without it, 8). Gradient clipping, as in the reference, reads the all-reduced
    gradient."""
    ddp = _one_step(tmp_path / "two", 2, "ddp", CLIP)
    assert ddp["counts"].tolist() == [[2, 2], [2, 2]]  # (all-reducing backward passes, optimizer steps)
    assert ddp["grad_norms"] == pytest.approx(one_process["grad_norms"], rel=1e-4)
    moved = 0.0
    for name, weight in one_process["weights"].items():
        torch.testing.assert_close(ddp["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, float((weight - one_process["initial"][name]).abs().max()))
    assert moved > 1e-3  # the step really changed the weights


def test_ddp_ranks_that_disagree_under_a_token_budget_take_one_path(tmp_path):
    """`algorithm.micro_batch_tokens` with one optimizer step and a row-local ICT (JS over whole groups): each rank
    cuts its own rows by their lengths. Operands 0–20 give the two ranks' groups prompts of different lengths, and
    the budget of 85 tokens holds rank 0's group but not rank 1's: alone, rank 0 would take the statistics from the
    update's forward and rank 1 could not. The ranks agree on the separate pass (step/fast_path.py: `everyone`; the
    two paths' collectives run in different orders), and 2 ranks end at the weights of one process."""
    budget = [
        "algorithm.ppo_epochs=1",
        "selector.scope=sequence",
        "algorithm.prompts_per_step=2",  # one group per rank
        "task.high=20",
        "algorithm.micro_batch_tokens=85",
    ]
    single = _one_step(tmp_path / "one", 1, "ddp", *budget)
    ddp = _one_step(tmp_path / "two", 2, "ddp", *budget)
    alone, took = ddp["paths"].T.tolist()
    assert sorted(alone) == [False, True], f"the ranks no longer disagree on their own ({alone}): retune the budget"
    assert took == [False, False] and ddp["counts"][:, 1].tolist() == [1, 1]
    for name, weight in single["weights"].items():
        torch.testing.assert_close(ddp["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(w, single["initial"][n]) for n, w in single["weights"].items())


def test_fsdp_step_with_gradient_clipping_equals_one_process(tmp_path, one_process):
    """`trainer=fsdp` on 2 ranks (FULL_SHARD, one unit per decoder layer: models/sharding.py) runs a step with
    `algorithm.grad_clip=1.0` — Lightning's own norm clipping raises under FSDP; the root's `clip_grad_norm_` clips
    over both ranks' shards — and ends with the weights of one process on the whole batch. The first optimizer step's
    gradient norm is above 1.0, so both runs really clip it to 1.0 (the second one, 0.004, is left alone)."""
    single = one_process
    fp32 = "trainer.strategy.mixed_precision.param_dtype=null"  # the sharding's math, not the preset's bf16 gathers
    fsdp = _one_step(tmp_path / "two", 2, "fsdp", CLIP, fp32)
    assert fsdp["counts"][:, 1].tolist() == [2, 2]  # optimizer steps per rank
    assert single["grad_norms"][0] == pytest.approx(1.0, abs=1e-5)
    assert fsdp["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4)
    assert single["grad_norms"][1] < 0.5
    # checkpoints hold the policy under its plain HF names (tokenrl-eval loads them unwrapped), the reference not at all
    assert fsdp["checkpoint_keys"] == single["checkpoint_keys"] == [f"policy.{name}" for name in single["weights"]]
    moved = 0.0
    for name, weight in single["weights"].items():
        torch.testing.assert_close(fsdp["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, float((weight - single["initial"][name]).abs().max()))
    assert moved > 1e-3
