"""The trained policy as a plain Hugging Face model folder (docs/export.md), written into a temporary folder beside the
target that replaces it once complete: `export_run` at the end of every run, `tokenrl-export` (run/trained_policy.py)
from any checkpoint. The weights stream from `served_weights` (LoRA merged; under FSDP gathered one unit at a time), so
the exporting rank holds at most one safetensors file of copies, never a second full model."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lightning as L
import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

from tokenrl.data.hub import hub_reachable
from tokenrl.models import DTYPES, _load_pretrained
from tokenrl.models.engine_weights import served_weights
from tokenrl.models.sharding import is_sharded
from tokenrl.records.settings import ModelSettings
from tokenrl.utils import as_dict

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)
SHARD_BYTES = 5 * 2**30  # one safetensors file holds at most this much (Hugging Face's usual 5 GB shards)
INDEX = "model.safetensors.index.json"
CARD_METRICS = ("reward_first5", "reward_last5", "train/reward", "train/accuracy", "train/entropy")
EXPORTED_FROM = "A plain Hugging Face causal LM exported by tokenrl from "  # the card's line naming the origin


@dataclass(frozen=True)
class RunConfig:
    """What a training run was: its composed config, its `model.*` as trained (after a warm-up: the warmed-up folder),
    Hydra's config-group choices (`selector=ict`, named on the card) and the config's file (None: the running run's)."""

    cfg: DictConfig
    model: ModelSettings
    choices: Mapping[str, Any]
    file: str | None = None


def export_dtype(cfg: DictConfig) -> str:
    """The dtype of the exported weights: `export.dtype` when set; else bf16 for a GPU run (`model.dtype=bf16`, or
    `trainer.accelerator` gpu/cuda: the GPU presets) and the model's own dtype otherwise (fp32 on the CPU presets)."""
    chosen = OmegaConf.select(cfg, "export.dtype")
    if chosen:
        return str(chosen)
    on_gpu = str(OmegaConf.select(cfg, "trainer.accelerator")) in ("gpu", "cuda")
    model = ModelSettings.of(as_dict(cfg.model))
    return "bf16" if on_gpu or model.dtype == "bf16" else model.dtype


def generation_config(settings: ModelSettings, architecture: GenerationConfig) -> GenerationConfig:
    """`model.source`'s generation config (sampling defaults, stop ids) where it has one, else the architecture's."""
    if settings.init == "pretrained" and settings.source is not None:
        with suppress(FileNotFoundError):
            return cast(GenerationConfig, _load_pretrained(settings.source, GenerationConfig))
    return architecture


def causal_lm_class(config: PretrainedConfig) -> type:
    return cast(type, AutoModelForCausalLM._model_mapping[type(config)])


def tied_copies(config: PretrainedConfig) -> set[str]:
    """The weights a causal LM of `config` ties to another (a tied head): left out, as `save_pretrained` leaves them."""
    if not getattr(config, "tie_word_embeddings", False):
        return set()
    return set(getattr(causal_lm_class(config), "_tied_weights_keys", None) or ())


def _shards(
    weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, skip: set[str]
) -> Iterator[dict[str, torch.Tensor]]:
    """The weights on the host in `dtype`, in groups of at most SHARD_BYTES (a larger tensor alone)."""
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        if name in skip:
            continue
        tensor = tensor.detach().to("cpu", dtype).contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > SHARD_BYTES:
            yield shard
            shard, size = {}, 0
        shard[name] = tensor
        size += nbytes
    yield shard


def write_weights(weights: Iterable[tuple[str, torch.Tensor]], folder: Path, dtype: str, skip: set[str]) -> int:
    """`model.safetensors` or `model-0000i-of-0000n.safetensors` + index (as `save_pretrained`); the bytes written."""
    files: list[tuple[Path, list[str]]] = []
    total = 0
    for number, shard in enumerate(_shards(weights, DTYPES[dtype], skip), 1):
        path = folder / f"part-{number:05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        files.append((path, list(shard)))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    if len(files) == 1:
        files[0][0].rename(folder / "model.safetensors")
        return total
    weight_map = {}
    for number, (path, names) in enumerate(files, 1):
        final = f"model-{number:05d}-of-{len(files):05d}.safetensors"
        path.rename(folder / final)
        weight_map.update(dict.fromkeys(names, final))
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return total


def write_model_folder(
    out: str | Path, policy: PreTrainedModel | PeftModel, tokenizer: PreTrainedTokenizerBase, dtype: str, card: str
) -> Path:
    """A Hugging Face model folder at `out` (replacing what is there) of `policy`: its served weights (LoRA merged),
    config and generation config. Under FSDP the other ranks must consume their `served_weights` meanwhile."""
    config = copy.deepcopy(policy.config)
    config.architectures = [causal_lm_class(config).__name__]
    config.dtype = DTYPES[dtype]
    config.use_cache = True
    with staged(out) as folder, served_weights(policy) as weights:
        size = write_weights(weights, folder, dtype, tied_copies(config))
        config.save_pretrained(folder)
        policy.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / "README.md").write_text(card)
    log.info("exported the policy to %s (%.2f GiB of %s weights)", out, size / 2**30, dtype)
    return Path(out)


def write_adapter_folder(out: Path, peft: Any, tokenizer: PreTrainedTokenizerBase, card: str, base: str | None) -> Path:
    """A LoRA run's adapter alone at `out` (`peft.save_pretrained`, its base named `base`), tokenizer and card."""
    peft.peft_config["default"].base_model_name_or_path = base
    with staged(out) as folder:
        peft.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / "README.md").write_text(card)
    log.info("exported the LoRA adapter to %s (base: %s)", out, base)
    return out


@contextmanager
def staged(out: str | Path) -> Iterator[Path]:
    """A temporary folder beside `out` to write into, which replaces `out` once the block ends without error (and is
    removed if it does not). Its files get the umask's modes (a temporary folder and safetensors' files are private)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        for path in [staging, *staging.rglob("*")]:
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
        if out.exists():
            shutil.rmtree(out)
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def saved_tokenizer(tokenizer: PreTrainedTokenizerBase, model: ModelSettings) -> PreTrainedTokenizerBase:
    """The tokenizer to save: the run's, except the character tokenizer of random models (`model.tokenizer=char`),
    saved as the byte-level BPE without merges that gives the same ids and text on its characters (printable ASCII;
    others: <unk> in the run, dropped or <unk> bytes here). transformers >= 5 loads any `qwen2` folder with Qwen2's
    byte-level pipeline built from the vocabulary in tokenizer.json, whatever else that file says, so a character
    vocabulary as trained would lose every space and newline under `AutoTokenizer`."""
    if model.tokenizer != "char":
        return tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbol = bytes_to_unicode()  # byte → the character byte-level BPE writes it as (" " → "Ġ")
    vocab = {
        (symbol[ord(token)] if len(token) == 1 else token): index for token, index in tokenizer.get_vocab().items()
    }
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=tokenizer.unk_token))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=tokenizer.pad_token,
        eos_token=tokenizer.eos_token,
        unk_token=tokenizer.unk_token,
        padding_side=tokenizer.padding_side,
    )


def _settings(node: Any) -> str:
    """`key=value` of a config node's own settings (not `_target_`), one line."""
    if not isinstance(node, Mapping):
        return str(node)
    return ", ".join(f"{key}={value}" for key, value in node.items() if not str(key).startswith("_")) or "defaults"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _target(node: Any) -> str:
    return str(node.get("_target_", "?")) if isinstance(node, Mapping) else "?"


def model_card(run: RunConfig, summary: Mapping[str, Any], origin: str, dtype: str | None) -> str:
    """README.md of an exported folder: how the weights were made (base model, method, selector, steps, data,
    weights) and the run's key metrics at that point; `dtype` None: a LoRA adapter's folder (peft)."""
    cfg, model, choices, adapter_only = run.cfg, run.model, run.choices, dtype is None
    resolved = {key: as_dict(cfg[key]) for key in ("selector", "task", "algorithm")}
    source, lora = model.source, model.lora
    hub_id = source and not Path(str(source)).expanduser().exists() and str(source).count("/") == 1
    selector = choices.get("selector") or cast(Any, get_class(_target(resolved["selector"]))).name
    base = f"`model={model.name}`: `{source}`"
    if model.init == "random":
        kind = model.architecture["model_type"]
        base = f"`model={model.name}`: random weights (seed {cfg.seed}) of its `{kind}` architecture"
    trainer = f", `trainer={choices['trainer']}`" if choices.get("trainer") else ""
    algorithm = resolved["algorithm"]
    method = (
        f"`algorithm={choices.get('algorithm') or algorithm['name']}` (group size {algorithm['group_size']}, "
        f"policy loss `{algorithm['policy_loss']}`, aggregation `{algorithm['aggregation']}`, KL β "
        f"{algorithm['kl_coef']} `{algorithm['kl_estimator']}`)"
    )
    method += "".join(f", `{group}={choices[group]}`" for group in ("method", "experiment") if choices.get(group))
    task = resolved["task"]
    data = f"`task={choices.get('task') or _target(task).rsplit('.', 1)[-1]}` (`{_target(task)}`"
    data += f", source `{task['source']}`" if task.get("source") else ""
    data += f', instruction "{task["instruction"]}")' if task.get("instruction") else ")"
    if adapter_only:
        weights = f"the LoRA adapter alone ({_settings(lora)}), as trained"
    else:
        weights = f"LoRA ({_settings(lora)}) merged into the base weights; {dtype}" if lora else f"full; {dtype}"
    metrics = {key: value for key, value in summary.items() if key in CARD_METRICS or key.startswith("val/")}
    rows = "\n".join(f"| `{key}` | {value:.4f} |" for key, value in metrics.items())
    tags = ", ".join(["tokenrl", "grpo", "reinforcement-learning", selector])
    front = ["---", "library_name: transformers", "pipeline_tag: text-generation", f"tags: [{tags}]"]
    front += [f"base_model: {source}"] if hub_id else []
    return "\n".join(
        [
            *front,
            "---",
            "",
            f"# {model.name} trained with tokenrl ({selector})",
            "",
            f"{EXPORTED_FROM}{origin}.",
            "",
            "| | |",
            "|---|---|",
            f"| base model | {base} |",
            f"| method | {method} |",
            f"| selector | `selector={selector}` (`{_target(resolved['selector'])}`: "
            f"{_settings(resolved['selector'])}) |",
            f"| steps | {_count(summary['rollout_steps'], 'rollout step')} "
            f"({_count(summary['optimizer_steps'], 'optimizer step')}) of `total_steps={cfg.total_steps}`, seed "
            f"{cfg.seed}{trainer} |",
            f"| data | {data} |",
            f"| weights | {weights} |",
            "",
            "## Metrics",
            "",
            "Training reward: mean of the first and the last 5 rollout steps, and of the last step; `val/*`: held-out "
            "pass@k at the last validation."
            if rows
            else "No metrics were recorded.",
            "",
            *(["| metric | value |", "|---|---|", rows, ""] if rows else []),
            "## Use",
            "",
            *(_adapter_use(source) if adapter_only else _folder_use(model.name)),
        ]
    )


def checkpoint_summary(state: Mapping[str, Any], run: Path | None) -> dict[str, Any]:
    """The run's summary.json when it describes this checkpoint's step (the final one), else the rewards the
    checkpoint's own state holds."""
    steps = int(state["rollout_step"])
    if run is not None and (run / "summary.json").is_file():
        summary: dict[str, Any] = json.loads((run / "summary.json").read_text())
        if summary.get("rollout_steps") == steps:
            return summary
    history = [float(reward) for reward in state["reward_history"]]
    summary = {"rollout_steps": steps, "optimizer_steps": int(state["optimizer_steps"])}
    if history:
        first, last = history[:5], history[-5:]
        summary |= {"reward_first5": sum(first) / len(first), "reward_last5": sum(last) / len(last)}
        summary["train/reward"] = history[-1]
    return summary


def exported_from(folder: str | Path) -> str | None:
    """The origin a tokenrl export's model card names (its run, or the checkpoint); None for any other folder."""
    card = Path(folder).expanduser() / "README.md"
    if not card.is_file():
        return None
    origins = [line for line in card.read_text(encoding="utf-8").splitlines() if line.startswith(EXPORTED_FROM)]
    return origins[0].removeprefix(EXPORTED_FROM).removesuffix(".") if origins else None


def _folder_use(name: str) -> list[str]:
    return [
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
        "```",
        "",
        f"tokenrl: `python eval.py model={name} model.source=<this folder> model.init=pretrained "
        "model.tokenizer=null model.lora=null`; vLLM: `vllm serve <this folder>` (docs/export.md).",
        "",
    ]


def _adapter_use(source: Any) -> list[str]:
    return [
        "```python",
        "from peft import AutoPeftModelForCausalLM",
        f'model = AutoPeftModelForCausalLM.from_pretrained("<this folder>")   # loads the base, {source}',
        "```",
        "",
    ]


def export_run(cfg: DictConfig, module: Any, trainer: L.Trainer, summary: Mapping[str, Any]) -> Path | None:
    """`<run>/model/` at the end of a run (`export.enabled`), from the module's policy: rank 0 writes; under FSDP
    every rank takes part in gathering the units."""
    if not cfg.export.enabled or (not trainer.is_global_zero and not is_sharded(module.policy)):
        return None
    if not trainer.is_global_zero:
        with served_weights(module.policy) as weights:
            deque(weights, maxlen=0)  # the gathers of the other ranks need this one's part
        return None
    from hydra.core.hydra_config import HydraConfig

    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    dtype, tokenizer = export_dtype(cfg), saved_tokenizer(module.tokenizer, module.model_settings)
    origin = f"the end of its training run `{cfg.paths.output_dir}`"
    card = model_card(RunConfig(cfg, module.model_settings, choices), summary, origin, dtype)
    return write_model_folder(Path(cfg.paths.output_dir) / "model", module.policy, tokenizer, dtype, card)


def push_to_hub(folder: Path, repo: str, private: bool) -> str:
    """Upload `folder` to the Hub model repository `repo` (created if missing; the token of `hf auth login` or HF_TOKEN)
    with huggingface_hub's `upload_folder`; the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    later = f"the folder is written: push it later with `hf upload {repo} {folder}`"
    if not hub_reachable():
        raise ConnectionError(
            f"--push-to-hub {repo}: the Hub does not answer (offline, or HF_HUB_OFFLINE set); {later}"
        )
    api = HfApi()
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder), repo_id=repo, repo_type="model", commit_message=f"tokenrl-export: {folder.name}"
        )
    except HfHubHTTPError as err:
        raise ConnectionError(
            f"--push-to-hub {repo}: {str(err).splitlines()[0]} (log in with `hf auth login` or "
            f"set HF_TOKEN with write access); {later}"
        ) from None
    return str(commit.commit_url)
