"""The commands that read a trained policy back: `tokenrl-export` (docs/export.md), a training checkpoint's policy
rebuilt from its run's saved config and written as a Hugging Face folder, and `python eval.py`, pass@k of a model (with
a training checkpoint's policy loaded into it: `ckpt_path`) on benchmarks (evaluation/runner.py)."""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.api import CheckpointException
from transformers import PreTrainedModel

import tokenrl.paths  # noqa: F401 — sets TOKENRL_ROOT, which the saved config's paths.* read
from tokenrl.config.check import check_eval_config
from tokenrl.data.benchmarks import expand
from tokenrl.data.prompts import PromptFormatter
from tokenrl.evaluation.runner import evaluate_benchmarks, resolved_path
from tokenrl.export.hf_folder import (
    RunConfig,
    checkpoint_summary,
    export_dtype,
    exported_from,
    generation_config,
    model_card,
    push_to_hub,
    saved_tokenizer,
    write_adapter_folder,
    write_model_folder,
)
from tokenrl.models import build_model, build_tokenizer, meta_model
from tokenrl.models.base_weights import base_reference, with_base
from tokenrl.records.settings import ModelSettings, RolloutSettings
from tokenrl.rollout import build_engine
from tokenrl.run.checkpointing import SHARDED_META, is_sharded_checkpoint, load_policy, policy_state_dict
from tokenrl.run.resume import checkpoint_meta
from tokenrl.utils import as_dict

if TYPE_CHECKING:
    from peft import PeftModel

# a user's settings or files: one `error:` line, exit status 2 (docs/errors.md)
EXPORT_ERRORS = (ValueError, FileNotFoundError, FileExistsError, ConnectionError)
EVAL_ERRORS = (ValueError, FileNotFoundError, PermissionError)


@dataclass(frozen=True)
class ExportOptions:
    """`tokenrl-export`'s options: the weights' dtype (None: `export_dtype`), a LoRA run's adapter alone, the run's
    config file (None: the run folder's), replace a non-empty folder, then push it to this Hub repository."""

    dtype: str | None = None
    adapter_only: bool = False
    config: str | Path | None = None
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False


def resolve_source(source: Path) -> tuple[Path, Path | None]:
    """The checkpoint that `source` names and the run folder it belongs to (None outside a run's checkpoints/)."""
    if not source.exists():
        raise FileNotFoundError(
            f"{source}: no such file or folder; give a run folder (logs/train/runs/<time>) or one "
            "of its checkpoints/*.ckpt"
        )
    if source.is_file() or is_sharded_checkpoint(source):
        return source, source.parent.parent if source.parent.name == "checkpoints" else None
    last = source / "checkpoints" / "last.ckpt"
    if last.is_file() or is_sharded_checkpoint(last):
        return last, source
    if (source / ".hydra").is_dir():
        found = ", ".join(sorted(p.name for p in (source / "checkpoints").glob("*.ckpt")))
        end = " (checkpoint.enabled=false): its model/ folder is the export of its end"
        hint = f"; export one of its checkpoints ({found})" if found else end
        raise FileNotFoundError(f"run folder {source} has no checkpoints/last.ckpt{hint}")
    if any(source.glob("*.distcp")):
        raise ValueError(
            f"{source} is an incomplete sharded checkpoint: its {SHARDED_META}, written last, is missing "
            "(a save cut short); export another checkpoint of the run"
        )
    if (source / "config.json").is_file():
        raise ValueError(
            f"{source} is already a Hugging Face model folder (config.json), not a tokenrl checkpoint: "
            "load it with from_pretrained, or evaluate it with `python eval.py model.source=<it> "
            "model.init=pretrained`"
        )
    raise ValueError(
        f"{source} is neither a tokenrl checkpoint (a .ckpt file, or a sharded checkpoint's folder "
        f"holding {SHARDED_META}) nor a run folder (logs/train/runs/<time>)"
    )


def run_config(config: str | Path | None, run: Path | None, ckpt: Path) -> RunConfig:
    """The training config of the run that wrote `ckpt` (`config`, else the run folder's) and Hydra's config-group
    choices of that run (from the hydra.yaml beside it, if there is one)."""
    path = Path(config) if config else (run / ".hydra" / "config.yaml" if run is not None else None)
    if path is None or not path.is_file():
        where = f"{path} is missing" if path is not None else "the checkpoint is outside a run folder"
        raise FileNotFoundError(
            f"no training config for {ckpt}: {where}; pass --config <run>/.hydra/config.yaml of "
            "the run that wrote it (it names the architecture and tokenizer)"
        )
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig) or "model" not in cfg or "init" not in cfg.model:
        raise ValueError(f"{path} has no `model` settings: not a tokenrl training config (<run>/.hydra/config.yaml)")
    hydra_file = path.parent / "hydra.yaml"
    choices = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.runtime.choices") if hydra_file.is_file() else None
    return RunConfig(cfg, ModelSettings.of(as_dict(cfg.model)), dict(choices) if choices else {}, str(config or path))


def read_checkpoint(ckpt: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The policy's weights and tokenrl's state (rollout steps, reward history) of a training checkpoint."""
    another = "export another checkpoint of the run (checkpoints/last.ckpt or a stepNNNN.ckpt)"
    if ckpt.is_file() and not zipfile.is_zipfile(ckpt):  # torch.save writes a zip archive, its directory last
        raise ValueError(
            f"{ckpt} is not a complete torch checkpoint: it does not end in a zip archive's directory, "
            f"so it is truncated (a copy or a save cut short), damaged or of another format; {another}"
        )
    try:
        weights = policy_state_dict(ckpt)
        meta = checkpoint_meta(ckpt)
    except ValueError as err:  # no `policy.*` weights
        raise ValueError(
            f"{err} tokenrl-export reads the checkpoints train.py writes (<run>/checkpoints/*.ckpt); "
            "a Hugging Face folder needs no export"
        ) from None
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, CheckpointException) as err:
        first = (str(err).strip().splitlines() or [""])[0].split(". ")[0]
        raise ValueError(
            f"{ckpt} cannot be read as a checkpoint ({type(err).__name__}: {first}): a damaged copy, or "
            f"not a torch checkpoint; {another}"
        ) from None
    if not isinstance(meta, Mapping) or "tokenrl" not in meta:
        raise ValueError(
            f"{ckpt} holds `policy.*` weights but no tokenrl state (rollout steps, rewards): it was not "
            "written by tokenrl's train.py; export a checkpoint of a tokenrl run"
        )
    return weights, meta["tokenrl"]


def policy_from_checkpoint(ckpt: Path, run: RunConfig) -> tuple[PreTrainedModel | PeftModel, dict[str, Any]]:
    """The policy of `model.*` (PEFT-wrapped with LoRA) holding the checkpoint's tensors themselves (built on the meta
    device: the weights are in memory once), and the checkpoint's tokenrl state. A LoRA checkpoint holds no base: it is
    built from `model.*` and `seed`, checked against the checkpoint's reference, and the adapters loaded onto it."""
    settings, seed = run.model, int(run.cfg.seed)
    weights, state = read_checkpoint(ckpt)
    if state.get("base") is not None:
        model = build_model(settings, seed=seed)
        loaded, assign = with_base(model, weights, state["base"], base_reference(model, settings, seed), ckpt), False
    else:
        model, loaded, assign = meta_model(settings), weights, True
    try:
        model.load_state_dict(loaded, strict=True, assign=assign)
    except RuntimeError as err:
        detail = " ".join(str(err).split())
        raise ValueError(
            f"the weights of {ckpt} do not fit model={settings.name} of {run.file} "
            f"({detail[:500]}{'…' if len(detail) > 500 else ''}); export with the config of the run "
            "that wrote the checkpoint (--config <that run>/.hydra/config.yaml)"
        ) from None
    return model, state


def export(source: str | Path, out: str | Path, options: ExportOptions | None = None) -> Path:
    """Write the policy of the checkpoint `source` names as a Hugging Face folder at `out` (docs/export.md) and print
    its path; with `options.push_to_hub`, upload it and print the commit's URL."""
    options = options or ExportOptions()
    ckpt, run = resolve_source(Path(source))
    trained = run_config(options.config, run, ckpt)
    out, settings = Path(out), trained.model
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not options.overwrite:
        raise FileExistsError(f"{out} exists and is not empty: name a new folder, or pass --overwrite to replace it")
    if options.adapter_only and not settings.lora:
        raise ValueError(
            f"--adapter-only: the run trained model={settings.name} without LoRA "
            "(model.lora=null), so there is no adapter; export the full weights without --adapter-only"
        )
    if options.adapter_only and options.dtype:
        raise ValueError(
            f"--dtype {options.dtype} with --adapter-only: the adapter is written as trained; leave out --dtype"
        )
    dtype = options.dtype or export_dtype(trained.cfg)
    policy, state = policy_from_checkpoint(ckpt, trained)
    tokenizer = saved_tokenizer(build_tokenizer(settings), settings)
    summary = checkpoint_summary(state, run)
    card = model_card(trained, summary, f"the checkpoint `{ckpt}`", None if options.adapter_only else dtype)
    if options.adapter_only:
        write_adapter_folder(out, policy, tokenizer, card, settings.source)
    else:
        policy.generation_config = generation_config(settings, policy.generation_config)
        write_model_folder(out, policy, tokenizer, dtype, card)
    print(out)
    if options.push_to_hub:
        print(push_to_hub(out, options.push_to_hub, options.private))
    return out


def model_label(cfg: DictConfig) -> str:
    """What the evaluated weights are: a training checkpoint, random weights, a tokenrl export (with the run or
    checkpoint its model card names) or the base weights of `model.source`."""
    source = cfg.model.source
    if cfg.ckpt_path:
        return f"checkpoint `{resolved_path(cfg.ckpt_path)}`"
    if cfg.model.init == "random":
        return f"random weights (seed {cfg.seed})"
    origin = exported_from(source)
    return f"`{resolved_path(source)}`, exported by tokenrl from {origin}" if origin else f"base weights `{source}`"


def evaluate_model(cfg: DictConfig) -> list[dict[str, Any]]:
    """pass@k of `model.*` (with `ckpt_path`'s policy) on each benchmark of `benchmark`, written in the run folder."""
    check_eval_config(cfg)
    names = expand(list(cfg.benchmark) if OmegaConf.is_list(cfg.benchmark) else str(cfg.benchmark))
    settings = ModelSettings.of(as_dict(cfg.model))
    tokenizer = build_tokenizer(settings)
    model = build_model(settings, seed=cfg.seed)
    if cfg.ckpt_path:
        load_policy(model, cfg.ckpt_path, settings, cfg.seed)
    model.eval()
    engine = build_engine(RolloutSettings.of(as_dict(cfg.rollout)), model, tokenizer)
    formatter = PromptFormatter(tokenizer, cfg.model.chat_template)
    return evaluate_benchmarks(cfg, names, engine, formatter, model_label(cfg))
