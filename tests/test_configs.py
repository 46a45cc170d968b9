"""Every config group composes; unknown choices name the valid ones; `--cfg job` prints the composed config."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import CONFIG_DIR, ROOT, compose_config

GROUPS = ["selector", "model", "task", "rollout", "algorithm", "trainer", "logger", "debug"]


def options(group: str) -> list[str]:
    from pathlib import Path

    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_resolves(group, option, tmp_path):
    cfg = compose_config([f"{group}={option}"], output_dir=tmp_path)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["total_steps"] > 0
    if group == "selector":
        assert option.startswith(instantiate(cfg.selector).name)   # stapo_v1 is a stapo variant
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
    assert (algo.aggregation, algo.clip_high, algo.kl_coef, algo.group_size, algo.dual_clip) == \
        ("token-mean", 0.28, 0.0, 8, 10.0)
    assert compose_config([], output_dir=tmp_path).algorithm.dual_clip is None   # GRPO as written: no dual clip


@pytest.mark.parametrize("group", ["selector", "model"])
def test_unknown_choice_lists_valid_ones(group):
    with pytest.raises(MissingConfigException) as err:
        compose_config([f"{group}=does_not_exist"])
    message = str(err.value)
    assert f"Could not find '{group}/does_not_exist'" in message
    for option in options(group):
        assert option in message


def test_cfg_job_prints_composed_config():
    out = subprocess.run([sys.executable, "train.py", "--cfg", "job", "model=qwen1.5b", "selector=uniform"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.model.name == "qwen1.5b" and cfg.model.source == "Qwen/Qwen2.5-1.5B"
    assert cfg.selector._target_ == "tokenrl.selectors.UniformSelector"


def test_unknown_selector_on_the_command_line_names_valid_choices():
    out = subprocess.run([sys.executable, "train.py", "selector=nope"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "Available options in 'selector'" in out.stderr and "uniform" in out.stderr
