"""Every config group composes; unknown choices name the valid ones; `--cfg job` prints the composed config."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import CONFIG_DIR, compose_config
from tests.helpers.forked_cli import forked_python
from tokenrl.config.check import ConfigError, check_config
from tokenrl.config.command_line import composition_problem
from tokenrl.config.known_settings import RENAMED

GROUPS = ["selector", "model", "task", "rollout", "algorithm", "trainer", "logger", "debug"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_resolves(group, option, tmp_path):
    cfg = compose_config([f"{group}={option}"], output_dir=tmp_path)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["total_steps"] > 0
    if group == "selector":
        assert option.startswith(instantiate(cfg.selector).name)  # stapo_v1 is a stapo variant
    if group == "model":
        assert resolved["model"]["name"] == option
        assert resolved["model"]["architecture"]["vocab_size"] > 0


def test_qwen_presets_carry_real_architecture_numbers(tmp_path):
    arch = compose_config(["model=qwen0.5b"], output_dir=tmp_path).model.architecture
    assert (arch.hidden_size, arch.num_hidden_layers, arch.vocab_size) == (896, 24, 151936)
    arch7 = compose_config(["model=qwen7b-instruct"], output_dir=tmp_path).model.architecture
    assert (arch7.hidden_size, arch7.num_key_value_heads, arch7.vocab_size) == (3584, 4, 152064)


def test_dapo_overrides_grpo(tmp_path):
    algo = compose_config(["algorithm=dapo"], output_dir=tmp_path).algorithm
    assert (algo.aggregation, algo.clip_high, algo.kl_coef, algo.group_size, algo.dual_clip) == (
        "token-mean",
        0.28,
        0.0,
        8,
        10.0,
    )
    assert compose_config([], output_dir=tmp_path).algorithm.dual_clip is None  # GRPO as written: no dual clip


@pytest.mark.parametrize("group", ["selector", "model"])
def test_unknown_choice_lists_valid_ones(group):
    with pytest.raises(MissingConfigException) as err:
        compose_config([f"{group}=does_not_exist"])
    message = str(err.value)
    assert f"Could not find '{group}/does_not_exist'" in message
    for option in options(group):
        assert option in message


@pytest.fixture(scope="module")
def cli_runs() -> list[subprocess.CompletedProcess]:
    """`python train.py --cfg job model=qwen1.5b selector=uniform` and `python train.py selector=nope`, each forked
    from the worker's process that imported tokenrl once (tests/helpers/forked_cli.py)."""
    return [
        forked_python(["train.py", *argv])
        for argv in (["--cfg", "job", "model=qwen1.5b", "selector=uniform"], ["selector=nope"])
    ]


@pytest.mark.slow
def test_cfg_job_prints_composed_config(cli_runs):
    out = cli_runs[0]
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.model.name == "qwen1.5b" and cfg.model.source == "Qwen/Qwen2.5-1.5B"
    assert cfg.selector._target_ == "tokenrl.selectors.UniformSelector"


@pytest.mark.slow
def test_unknown_selector_on_the_command_line_names_valid_choices(cli_runs):
    out = cli_runs[1]
    assert out.returncode == 2  # a user's error (docs/errors.md): one line, before any run folder
    assert "no such preset (the selector presets: archer," in out.stderr and "uniform" in out.stderr


# Every field of the six Qwen2.5 presets (configs/model/qwen*.yaml state only their deltas over
# configs/base/qwen2.5.yaml; the instruct files over their base-model size): composing must give exactly this.
QWEN_COMMON = {
    "tokenizer": None,
    "init": "pretrained",
    "dtype": "fp32",
    "reference_dtype": "bf16",
    "lora": None,
    "paper_task": "gsm8k",
}
QWEN_ARCH_COMMON = {
    "model_type": "qwen2",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "bos_token_id": 151643,
    "pad_token_id": 151643,
}
# name: (micro_batch_size, stats_chunk_size, hidden, intermediate, layers, heads, kv heads, vocab, tied, max positions,
#        gradient checkpointing: off where the memory plan fits the paper's shape on 80 GB without it)
QWEN_SIZES = {
    "qwen0.5b": (8, 512, 896, 4864, 24, 14, 2, 151936, True, 32768, False),
    "qwen1.5b": (4, 512, 1536, 8960, 28, 12, 2, 151936, True, 131072, False),
    "qwen7b": (2, 256, 3584, 18944, 28, 28, 4, 152064, False, 131072, True),
}


@pytest.mark.parametrize("name", [f"{size}{kind}" for size in QWEN_SIZES for kind in ("", "-instruct")])
def test_qwen_presets_compose_to_their_full_settings(name, tmp_path):
    cfg = compose_config([f"model={name}"], output_dir=tmp_path)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    size, instruct = name.removesuffix("-instruct"), name.endswith("-instruct")
    micro, chunk, hidden, inter, layers, heads, kv, vocab, tied, positions, checkpointing = QWEN_SIZES[size]
    repo = {"qwen0.5b": "Qwen2.5-0.5B", "qwen1.5b": "Qwen2.5-1.5B", "qwen7b": "Qwen2.5-7B"}[size]
    assert model == {
        "name": name,
        "source": f"Qwen/{repo}" + ("-Instruct" if instruct else ""),
        **QWEN_COMMON,
        "chat_template": "auto" if instruct else False,
        "stats_chunk_size": chunk,
        "gradient_checkpointing": checkpointing,
        "architecture": {
            **QWEN_ARCH_COMMON,
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": inter,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "max_position_embeddings": 32768 if instruct else positions,
            "tie_word_embeddings": tied,
            "eos_token_id": 151645 if instruct else 151643,
        },
    }
    assert (cfg.algorithm.prompts_per_step, cfg.algorithm.micro_batch_size, cfg.algorithm.optimizer.lr) == (
        32,
        micro,
        1e-6,
    )


def test_rollout_presets_share_one_sampling_base(tmp_path):
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 32, "max_prompt_length": 256}
    vllm = {
        "engine": "vllm",
        "max_model_len": 2048,
        "dtype": "float32",
        "kv_cache_gib": 1,
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
        "sync_bucket_mb": 256,
        "sleep_level": 2,
        "tensor_parallel_size": 1,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": None,
        "max_num_seqs": None,
    }
    expected = {
        "hf": {"engine": "hf", "decoding": "auto", **sampling},
        "vllm": {**sampling, **vllm},
        "vllm_gpu": {
            **sampling,
            **vllm,
            "dtype": "bfloat16",
            "enforce_eager": False,
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 4096,
            "max_num_seqs": 256,
        },
    }
    for name, want in expected.items():
        rollout = compose_config([f"rollout={name}"], output_dir=tmp_path).rollout
        assert OmegaConf.to_container(rollout, resolve=True) == want, name


@pytest.mark.parametrize("model", options("model"))
def test_batch_presets_are_set_by_the_model_under_their_one_name(model, tmp_path):
    cfg = compose_config([f"model={model}"], output_dir=tmp_path)
    batch = yaml.safe_load((Path(CONFIG_DIR) / "batch" / f"{model.removesuffix('-instruct')}.yaml").read_text())
    assert cfg.algorithm.micro_batch_size == batch["micro_batch_size"] > 0  # each model's own preset
    assert cfg.algorithm.prompts_per_step > 0 and cfg.algorithm.optimizer.lr > 0 and cfg.model.stats_chunk_size > 0
    assert not {"lr", "prompts_per_step", "micro_batch_size"} & set(cfg.model)  # no second name under model
    moved = compose_config(
        [
            f"model={model}",
            "algorithm.prompts_per_step=3",
            "algorithm.micro_batch_size=5",
            "algorithm.optimizer.lr=0.5",
        ],
        output_dir=tmp_path,
    )
    assert (moved.algorithm.prompts_per_step, moved.algorithm.micro_batch_size, moved.algorithm.optimizer.lr) == (
        3,
        5,
        0.5,
    )


@pytest.mark.parametrize("old,new", sorted(RENAMED.items()))
def test_an_old_name_stops_with_one_line_naming_the_new_one(old, new):
    problem = composition_problem([old + "=3"])
    assert problem == f"{old}=3: this setting's one name is {new}: write {new}=3"
    with pytest.raises(ConfigError, match=re.escape(f"{old}=3: this setting's one name is {new}")):
        check_config(compose_config([f"+{old}=3"]))


def test_the_selectors_warmup_is_one_top_level_knob_named_for_them(tmp_path):
    for selector in ("ict", "ict_complement", "random"):  # Θ: one knob, so the random control always matches ICT
        cfg = compose_config([f"selector={selector}", "selector_warmup_steps=7"], output_dir=tmp_path)
        assert instantiate(cfg.selector).warmup_steps == 7
    cfg = compose_config([], output_dir=tmp_path)
    assert cfg.selector_warmup_steps == 0 and "warmup_steps" not in cfg  # not to be confused with the lr warm-up
    assert compose_config(["experiment=ict_paper"], output_dir=tmp_path).selector_warmup_steps == 20  # the paper's Θ
    assert cfg.algorithm.lr_warmup_steps == 0
