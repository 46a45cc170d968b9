"""Policy construction: pretrained (hub id or local folder) or random weights from real architecture numbers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tokenrl.data.hub import hub_reachable
from tokenrl.models.char_tokenizer import build_char_tokenizer
from tokenrl.records.settings import ModelSettings

if TYPE_CHECKING:
    from peft import PeftModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[name]


def _load_pretrained(source: str | None, loader: Any, field: str = "model.source", **kwargs: Any) -> Any:
    """A local folder, or a hub id (from the Hugging Face cache alone when the Hub does not answer, so an offline
    run fails in seconds instead of retrying for a minute); `field` is the option that named it."""
    if source is None:
        raise ValueError(f"{field}=null: name a local model folder or a hub id")
    local = Path(source).expanduser()
    if local.exists():
        try:
            return loader.from_pretrained(str(local), **kwargs)
        except (OSError, ValueError) as err:  # the folder is there: say what failed in it, not that it is missing
            raise ValueError(
                f"{field}={source!r} is a folder that does not load ({type(err).__name__}: {err}). "
                f"A model folder holds config.json, the weights and the tokenizer files: re-run "
                f"`bash scripts/setup.sh` for the offline default, or point {field} at a complete "
                f"Hugging Face folder."
            ) from err
    try:
        if not hub_reachable():
            kwargs["local_files_only"] = True
            if loader is AutoModelForCausalLM:  # its PEFT-adapter lookup ignores local_files_only otherwise
                kwargs["adapter_kwargs"] = {"local_files_only": True}
        return loader.from_pretrained(source, **kwargs)
    except (OSError, ValueError):  # ValueError: huggingface_hub's HFValidationError for a path that is no repo id
        raise FileNotFoundError(
            f"{field}={source!r} is neither a prepared local folder nor reachable on the hub. Offline: download it "
            f"where the Hub answers (`huggingface-cli download {source} --local-dir DIR`), copy DIR to this machine "
            f"and set {field}=DIR (`bash scripts/setup.sh` prepares only the offline default, SmolLM2-135M-Instruct); "
            f"for tests and throughput runs on a machine that holds the model, random weights with a character "
            f"tokenizer need no files: add `model.init=random model.tokenizer=char`."
        ) from None


def build_tokenizer(settings: ModelSettings) -> PreTrainedTokenizerBase:
    """Tokenizer named by `model.tokenizer` (a path, a hub id or `char`), else the one of `model.source`."""
    name = settings.tokenizer or settings.source
    if name == "char":
        tokenizer = build_char_tokenizer(int(settings.architecture["vocab_size"]))
    else:
        tokenizer = _load_pretrained(name, AutoTokenizer, "model.tokenizer" if settings.tokenizer else "model.source")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def with_lora(model: PreTrainedModel, settings: ModelSettings) -> PreTrainedModel | PeftModel:
    """`model` with `model.lora`'s adapters (peft), or as it is without LoRA."""
    if not settings.lora:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **dict(settings.lora)))


def meta_model(settings: ModelSettings) -> PreTrainedModel | PeftModel:
    """The model of `model.*` (with its LoRA adapters) on the meta device, from its `architecture` for random weights,
    else the config of `model.source`: its names and shapes, no weights read."""
    if settings.init == "random":
        arch = dict(settings.architecture)
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    else:
        config = _load_pretrained(settings.source, AutoConfig)  # offline: the same error as the model's load
    with torch.device("meta"):
        return with_lora(AutoModelForCausalLM.from_config(config, dtype=torch_dtype(settings.dtype)), settings)


def build_model(settings: ModelSettings, seed: int = 0) -> PreTrainedModel | PeftModel:
    """The policy: `init=pretrained` loads `source`; `init=random` builds `architecture` with seeded random weights,
    drawn on the host (CPU RNG) so that a seed means the same weights on any device and strategy."""
    dtype = torch_dtype(settings.dtype)
    if settings.init == "pretrained":
        model = _load_pretrained(settings.source, AutoModelForCausalLM, dtype=dtype)
    elif settings.init == "random":
        arch = dict(settings.architecture)
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
        # drawn on the host whatever device the caller's context names (Lightning builds `configure_model` inside
        # `torch.device("cuda")` on one GPU but not under FSDP): the same seed gives the same weights everywhere
        with torch.random.fork_rng(), torch.device("cpu"):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        raise ValueError(f"model.init={settings.init!r} must be 'pretrained' or 'random'")
    model.config.use_cache = True
    model = with_lora(model, settings)
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def build_reference(policy: PreTrainedModel, dtype: str | None) -> PreTrainedModel:
    """The frozen reference of the KL term: the initial policy's weights in `model.reference_dtype` (`bf16` halves its
    memory on GPU presets; None keeps the policy's dtype). Built on the meta device and filled tensor by tensor in its
    dtype, so the host never holds a second full-precision copy (a deep copy of a 7B fp32 policy is 28 GiB more per
    rank). Buffers keep their dtype (RoPE's inverse frequencies stay fp32, as transformers builds them for a bf16
    model); tied embeddings stay tied."""
    target = torch_dtype(dtype) if dtype is not None else None
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(copy.deepcopy(policy.config))
    for name, param in policy.named_parameters():  # tied weights appear once
        owner, _, leaf = name.rpartition(".")
        value = param.detach().to(target) if target is not None else param.detach().clone()
        setattr(reference.get_submodule(owner), leaf, torch.nn.Parameter(value, requires_grad=False))
    for name, buffer in policy.named_buffers():
        owner, _, leaf = name.rpartition(".")
        reference.get_submodule(owner)._buffers[leaf] = buffer.detach().clone()
    reference.tie_weights()
    reference.generation_config = copy.deepcopy(policy.generation_config)
    return reference.eval().requires_grad_(False)
