"""A model preset whose hub source cannot be reached fails in seconds, with the message naming the offline routes,
and the advised offline overrides build the model; the KL reference is built in its dtype."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

PROBE = """
import time
from transformers import AutoModelForCausalLM, AutoTokenizer
from tokenrl.models import _load_pretrained
for loader in (AutoTokenizer, AutoModelForCausalLM):
    start = time.perf_counter()
    try:
        _load_pretrained("Qwen/Qwen2.5-0.5B", loader)
    except FileNotFoundError as err:
        print(f"{time.perf_counter() - start:.2f}", err)
"""


@pytest.mark.slow
def test_an_unreachable_hub_model_fails_in_seconds(tmp_path):
    """The Hub endpoint refuses connections and the cache is empty: without the connect check, each file request
    is retried with back-off for over 20 s."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stderr[-3000:]
    for line in lines:
        seconds, message = line.split(" ", 1)
        assert float(seconds) < 5
        assert message.startswith(
            "model.source='Qwen/Qwen2.5-0.5B' is neither a prepared local folder nor reachable "
            "on the hub. Offline: download it where the Hub answers (`huggingface-cli download "
            "Qwen/Qwen2.5-0.5B --local-dir DIR`), copy DIR to this machine and set "
            "model.source=DIR"
        )


ADVICE_PROBE = """
import json, re, sys
import pytest
import torch
from omegaconf import OmegaConf
from tests.conftest import compose_config
from tokenrl.models import build_model, build_tokenizer
from tokenrl.records.settings import ModelSettings

def build(overrides):
    settings = ModelSettings.of(OmegaConf.to_container(compose_config(overrides).model, resolve=True))
    return build_tokenizer(settings), build_model(settings)

for command in json.loads(sys.argv[1]):
    try:
        build(command)
    except FileNotFoundError as err:
        advice = re.search(r"add `([^`]*)`", str(err)).group(1).split()
        tokenizer, model = build(command + advice)
        ids = torch.tensor([tokenizer("What is 2 + 3?")["input_ids"]])
        print(json.dumps({"error": str(err), "advice": advice, "vocab": [len(tokenizer), model.config.vocab_size],
                          "logits": list(model(ids).logits.shape)}))
"""


@pytest.mark.slow
def test_the_offline_advice_builds_the_model(tmp_path):
    """Offline with nothing cached, a hub model fails naming the option and advising overrides; the command with
    exactly those overrides added builds the tokenizer and the model and runs a forward pass. `model.init=random`
    alone (the former advice) still loads the tokenizer from the hub id, so it fails too and gets the same advice."""
    hub = ["model=smollm2_135m", "model.source=HuggingFaceTB/SmolLM2-135M-Instruct"]
    commands = {
        "model.source='HuggingFaceTB/SmolLM2-135M-Instruct'": [hub, hub + ["model.init=random"]],
        "model.tokenizer='Qwen/Qwen2.5-0.5B'": [["model=tiny", "model.tokenizer=Qwen/Qwen2.5-0.5B"]],
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-c", ADVICE_PROBE, json.dumps(sum(commands.values(), []))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == 3, done.stderr[-3000:]
    options = [option for option, runs in commands.items() for _ in runs]
    for option, result, vocab in zip(options, results, [49152, 49152, 128]):
        assert result["error"].startswith(f"{option} is neither a prepared local folder nor reachable on the hub.")
        assert result["advice"] == ["model.init=random", "model.tokenizer=char"]
        assert result["vocab"] == [vocab, vocab] and result["logits"] == [1, 14, vocab]


@pytest.mark.parametrize("kind", ["model", "tokenizer"])
def test_a_folder_that_does_not_load_is_named_with_what_failed(tmp_path, kind):
    """An existing folder is never reported as missing: its loader's own error is kept in the message."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tokenrl.models import _load_pretrained

    (tmp_path / "config.json").write_text("{not json")
    loader = AutoModelForCausalLM if kind == "model" else AutoTokenizer
    with pytest.raises(ValueError, match=rf"model.source='{tmp_path}' is a folder that does not load \(") as err:
        _load_pretrained(str(tmp_path), loader)
    assert "re-run `bash scripts/setup.sh`" in str(err.value) and err.value.__cause__ is not None


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_the_reference_is_the_policy_in_its_dtype_without_a_full_precision_copy(dtype, monkeypatch):
    """Every parameter equals the policy's cast to `reference_dtype`, buffers keep theirs (RoPE's fp32 inverse
    frequencies), tied embeddings stay tied, nothing is left on the meta device, and the policy is never deep-copied
    (a 7B fp32 copy is 28 GiB of host memory per rank)."""
    import copy

    from tests.helpers.tiny import tiny_policy
    from tokenrl.models import build_reference

    policy, tokenizer = tiny_policy()
    real_deepcopy = copy.deepcopy

    def no_model_copies(obj, *args, **kwargs):
        assert not isinstance(obj, torch.nn.Module), "the policy was deep-copied"
        return real_deepcopy(obj, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", no_model_copies)
    reference = build_reference(policy, dtype)
    expected_dtype = torch.bfloat16 if dtype else torch.float32
    params = dict(reference.named_parameters())
    for name, param in policy.named_parameters():
        assert params[name].dtype == expected_dtype and torch.equal(params[name], param.detach().to(expected_dtype))
        assert not params[name].requires_grad
    for (name, buffer), (_, copied) in zip(policy.named_buffers(), reference.named_buffers()):
        assert copied.dtype == buffer.dtype and torch.equal(copied, buffer), name
    assert not any(t.is_meta for t in [*reference.parameters(), *reference.buffers()])
    assert reference.lm_head.weight is reference.model.embed_tokens.weight  # tied, as the policy's
    assert not reference.training
    ids = torch.tensor([tokenizer("What is 2 + 3?")["input_ids"]])
    with torch.no_grad():
        want = policy.eval()(ids).logits
        got = reference(ids).logits.float()
    assert torch.allclose(got, want, atol=1e-6 if dtype is None else 0.1)


def test_random_weights_are_drawn_on_the_host_whatever_the_callers_device_context():
    """Lightning builds `configure_model` inside `torch.device("cuda")` on one GPU and outside it under FSDP; the CUDA
    RNG draws other numbers than the CPU's, so one seed gave a single-GPU run and an FSDP run different initial
    weights (seen on an H200). A meta-device context stands in for CUDA here: the weights must still be real and the
    same as outside any context."""
    from tests.helpers.tiny import tiny_settings
    from tokenrl.models import build_model

    cfg = tiny_settings()
    plain = build_model(cfg, seed=3).state_dict()
    with torch.device("meta"):
        inside = build_model(cfg, seed=3).state_dict()
    assert plain.keys() == inside.keys()
    for name, tensor in plain.items():
        assert inside[name].device.type == "cpu" and torch.equal(inside[name], tensor), name
