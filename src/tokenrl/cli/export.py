"""`tokenrl-export SOURCE OUT` (`python -m tokenrl.cli.export`): a training checkpoint as a plain Hugging Face model
folder, the same folder every run writes to `<run>/model/` at its end (export/hf_folder.py), from any checkpoint:
`last.ckpt`, the best or a periodic `stepNNNN.ckpt`, a sharded FSDP checkpoint's folder, or a run folder (its
`checkpoints/last.ckpt`). The architecture and tokenizer are rebuilt from the run's saved config
(`<run>/.hydra/config.yaml`, or `--config`); the checkpoint is read once, into one process (`policy_state_dict`). A LoRA
run's checkpoint holds the adapters alone: they go onto the base rebuilt from the config's `model.*`, refused unless it
is the base they were trained on (models/base_weights.py).

    tokenrl-export logs/train/runs/<time> out/ [--dtype bf16|fp32|fp16] [--adapter-only] [--config YAML]
                   [--overwrite] [--push-to-hub USER/NAME [--private]]

A bad input prints one `error:` line naming what is wrong and how to fix it, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.api import CheckpointException
from transformers import GenerationConfig, PreTrainedModel

import tokenrl.paths  # noqa: F401 — sets TOKENRL_ROOT, which the saved config's paths.* read
from tokenrl.cli.errors import OneLineParser
from tokenrl.data.hub import hub_reachable
from tokenrl.export.hf_folder import export_dtype, model_card, saved_tokenizer, staged, write_model_folder
from tokenrl.models import DTYPES, _load_pretrained, build_model, build_tokenizer, meta_model
from tokenrl.models.base_weights import with_base
from tokenrl.models.engine_weights import served_weights
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import SHARDED_META, is_sharded_checkpoint, policy_state_dict

log = logging.getLogger(__name__)
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, ConnectionError)


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
        found = (
            sorted(p.name for p in (source / "checkpoints").glob("*.ckpt")) if (source / "checkpoints").is_dir() else []
        )
        raise FileNotFoundError(
            f"run folder {source} has no checkpoints/last.ckpt"
            + (
                f"; export one of its checkpoints ({', '.join(found)})"
                if found
                else " (checkpoint.enabled=false): its model/ folder is the export of its end"
            )
        )
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


def run_config(config: Path | None, run: Path | None, ckpt: Path) -> tuple[DictConfig, dict[str, Any]]:
    """The training config of the run that wrote `ckpt` and Hydra's config-group choices of that run (from the
    hydra.yaml beside it, if there is one)."""
    path = config or (run / ".hydra" / "config.yaml" if run is not None else None)
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
    return cfg, dict(choices) if choices else {}


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
        meta = torch.load(
            ckpt / SHARDED_META if ckpt.is_dir() else ckpt, map_location="cpu", weights_only=True, mmap=ckpt.is_file()
        )
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


def policy_from_checkpoint(
    settings: ModelSettings,
    weights: dict[str, torch.Tensor],
    state: Mapping[str, Any],
    seed: int,
    ckpt: Path,
    config_path: str,
) -> PreTrainedModel:
    """The policy of `model.*` (PEFT-wrapped with LoRA) holding the checkpoint's tensors themselves: built on the meta
    device and given them, so the weights are in memory once. A LoRA checkpoint without its base (`state["base"]`, its
    reference): the base built from `model.*` and `seed`, checked against it, with the adapters loaded onto it."""
    if state.get("base") is not None:
        model = build_model(settings, seed=seed)
        weights, assign = with_base(model, weights, state["base"], settings, seed, ckpt), False
    else:
        model, assign = meta_model(settings), True
    try:
        model.load_state_dict(weights, strict=True, assign=assign)
    except RuntimeError as err:
        detail = " ".join(str(err).split())
        raise ValueError(
            f"the weights of {ckpt} do not fit model={settings.name} of {config_path} "
            f"({detail[:500]}{'…' if len(detail) > 500 else ''}); export with the config of the run "
            "that wrote the checkpoint (--config <that run>/.hydra/config.yaml)"
        ) from None
    return model


def generation_config(settings: ModelSettings, model: PreTrainedModel) -> GenerationConfig:
    """`model.source`'s generation config (sampling defaults, stop ids) where it has one, else the architecture's."""
    if settings.init == "pretrained":
        try:
            return _load_pretrained(settings.source, GenerationConfig)
        except FileNotFoundError:
            pass
    return model.generation_config


def checkpoint_summary(state: Mapping[str, Any], run: Path | None) -> dict[str, Any]:
    """The run's summary.json when it describes this checkpoint's step (the final one), else the rewards the
    checkpoint's own state holds."""
    steps = int(state["rollout_step"])
    summary_file = run / "summary.json" if run is not None else None
    if summary_file is not None and summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        if summary.get("rollout_steps") == steps:
            return summary
    history = [float(reward) for reward in state["reward_history"]]
    summary = {"rollout_steps": steps, "optimizer_steps": int(state["optimizer_steps"])}
    if history:
        summary.update(
            {
                "reward_first5": sum(history[:5]) / len(history[:5]),
                "reward_last5": sum(history[-5:]) / len(history[-5:]),
                "train/reward": history[-1],
            }
        )
    return summary


def export(
    source: str | Path,
    out: str | Path,
    dtype: str | None = None,
    adapter_only: bool = False,
    config: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the policy of the checkpoint `source` names as a Hugging Face folder at `out` (docs/export.md)."""
    ckpt, run = resolve_source(Path(source))
    cfg, choices = run_config(Path(config) if config else None, run, ckpt)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty: name a new folder, or pass --overwrite to replace it")
    settings = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    if adapter_only and not settings.lora:
        raise ValueError(
            f"--adapter-only: the run trained model={settings.name} without LoRA "
            "(model.lora=null), so there is no adapter; export the full weights without --adapter-only"
        )
    if adapter_only and dtype:
        raise ValueError(f"--dtype {dtype} with --adapter-only: the adapter is written as trained; leave out --dtype")
    dtype = dtype or export_dtype(cfg)
    weights, state = read_checkpoint(ckpt)
    config_path = str(config or run / ".hydra" / "config.yaml")
    policy = policy_from_checkpoint(settings, weights, state, int(cfg.seed), ckpt, config_path)
    tokenizer = saved_tokenizer(build_tokenizer(settings), settings)
    card = model_card(
        cfg, settings, choices, checkpoint_summary(state, run), f"the checkpoint `{ckpt}`", dtype, adapter_only
    )
    if adapter_only:
        policy.peft_config["default"].base_model_name_or_path = settings.source
        with staged(out) as folder:
            policy.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            (folder / "README.md").write_text(card)
        log.info("exported the LoRA adapter to %s (base: %s)", out, settings.source)
        return out
    with served_weights(policy) as named:
        return write_model_folder(
            out, named, policy.config, generation_config(settings, policy), tokenizer, dtype, card
        )


def push_to_hub(folder: Path, repo: str, private: bool) -> str:
    """Upload `folder` to the Hub model repository `repo` (created if missing) with huggingface_hub's `upload_folder`;
    the token of `hf auth login` or HF_TOKEN. Returns the commit's URL."""
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
    return commit.commit_url


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="tokenrl-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "source", help="a run folder (its checkpoints/last.ckpt), a .ckpt file or a sharded checkpoint's folder"
    )
    parser.add_argument("out", help="the Hugging Face folder to write")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        help="the weights' dtype (default: export.dtype of the "
        "run; unset, bf16 for GPU runs and the model's dtype otherwise)",
    )
    parser.add_argument("--adapter-only", action="store_true", help="a LoRA run's adapter alone (peft), not merged")
    parser.add_argument(
        "--config", help="the run's .hydra/config.yaml (default: the one of the run folder that holds the checkpoint)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it exists and is not empty")
    parser.add_argument("--push-to-hub", metavar="REPO", help="then upload OUT to this Hub model repository")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = export(args.source, args.out, args.dtype, args.adapter_only, args.config, args.overwrite)
        print(out)
        if args.push_to_hub:
            print(push_to_hub(out, args.push_to_hub, args.private))
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
