"""rollout/hf.py's decoding modes: the static KV cache generates what the dynamic cache generates (greedy: the same
tokens; sampled with one seed: the same tokens and log-probs), with ragged prompts (left padding) and EOS, and its
sampled log-probs equal the trainer's as the dynamic path's do. Uncompiled on the CPU: `static_compiled` is the same
cache with the decode step under torch.compile (CUDA graphs), checked on a GPU by scripts/bench/engines.py."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.helpers.tiny import PROMPTS, tiny_policy
from tokenrl.models.response_forward import response_logprobs
from tokenrl.rollout.engine import SamplingParams
from tokenrl.rollout.hf import CACHE_BUCKET, HFEngine

GREEDY = {"temperature": 1.0, "top_p": 1.0, "top_k": 1}


def generate(engine, prompts, seed=0, n=2, max_new_tokens=24, **sampling):
    tok = engine.tokenizer
    ids = [tok(p)["input_ids"] for p in prompts]
    params = SamplingParams(
        n=n, max_new_tokens=max_new_tokens, **({"temperature": 1.0, "top_p": 1.0, "top_k": 0} | sampling)
    )
    return engine.generate(ids, params, seed=seed)


def same_batch(a, b, atol=1e-5):
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert a.finish_reasons == b.finish_reasons and a.texts == b.texts
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)
    torch.testing.assert_close(a.sampling_logprobs, b.sampling_logprobs, atol=atol, rtol=0)


def engines():
    model, tok = tiny_policy()
    return model, HFEngine(model, tok, decoding="dynamic"), HFEngine(model, tok, decoding="static")


def test_prompts_are_ragged():
    _, tok = tiny_policy()
    assert len({len(tok(p)["input_ids"]) for p in PROMPTS}) == len(PROMPTS)  # left padding differs per row


def test_greedy_static_equals_dynamic_with_ragged_prompts():
    _, dynamic, static = engines()
    same_batch(generate(dynamic, PROMPTS, **GREEDY), generate(static, PROMPTS, **GREEDY))


def test_greedy_static_equals_dynamic_when_rows_stop_at_eos():
    """A token the greedy rows emit mid-way made an EOS: rows stop at different lengths (the rest padded), and the
    static cache stops them at the same tokens."""
    _, dynamic, static = engines()
    free = generate(dynamic, PROMPTS, **GREEDY)
    eos = int(free.response_ids[0, 5])
    for engine in (dynamic, static):
        engine.eos_ids = sorted({*engine.eos_ids, eos})
    a, b = generate(dynamic, PROMPTS, **GREEDY), generate(static, PROMPTS, **GREEDY)
    same_batch(a, b)
    assert "stop" in a.finish_reasons
    assert len(set(a.response_mask.sum(1).tolist())) > 1  # rows of different lengths


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 0.7, "top_p": 0.9, "top_k": 0}, {"temperature": 1.3, "top_p": 1.0, "top_k": 20}],
    ids=["plain", "t0.7-top_p", "t1.3-top_k"],
)
def test_sampling_with_one_seed_static_equals_dynamic(sampling):
    _, dynamic, static = engines()
    same_batch(generate(dynamic, PROMPTS, seed=7, n=3, **sampling), generate(static, PROMPTS, seed=7, n=3, **sampling))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_static_sampling_logprobs_equal_trainer_logprobs(temperature):
    """The engine-trainer gap of the static path is the dynamic path's (tests/rollout/test_hf_engine.py, 1e-5)."""
    model, _, static = engines()
    batch = generate(static, PROMPTS, seed=3, n=3, temperature=temperature)
    trainer = response_logprobs(model, batch, temperature).detach() * batch.response_mask
    assert torch.allclose(batch.sampling_logprobs, trainer, atol=1e-5)


def test_the_static_cache_is_kept_across_calls_and_reset():
    """Same rows: one cache (its addresses are a CUDA graph's inputs), reset, rounded up to CACHE_BUCKET tokens;
    shorter prompts in a longer cache give the dynamic path's tokens; other rows: a new cache."""
    _, dynamic, static = engines()
    generate(static, PROMPTS, **GREEDY)
    cache, key = static._cache, static._cache_key
    assert key[0] == len(PROMPTS) * 2 and key[3] % CACHE_BUCKET == 0
    short = ["Hi", "What?", "Say 7."]
    same_batch(generate(dynamic, short, seed=1), generate(static, short, seed=1))
    assert static._cache is cache
    generate(static, short[:2], **GREEDY)
    assert static._cache is not cache and static._cache_key[0] == 4
    static.release_cache()
    assert static._cache is None


def test_an_interrupt_stops_the_static_path_within_a_token():
    _, _, static = engines()
    static.interrupt = lambda: True
    assert generate(static, PROMPTS).response_ids.shape[1] == 1


def test_auto_is_dynamic_on_a_cpu_and_an_unknown_mode_is_refused():
    model, tok = tiny_policy()
    assert HFEngine(model, tok).decoding_on(torch.device("cpu")) == "dynamic"
    assert HFEngine(model, tok).decoding_on(torch.device("cuda")) == "static_compiled"
    assert HFEngine(model, tok, decoding="static").decoding_on(torch.device("cuda")) == "static"
    with pytest.raises(ValueError, match="rollout.decoding='paged'"):
        HFEngine(model, tok, decoding="paged")


def test_auto_falls_back_to_the_dynamic_cache_when_the_compiled_decode_fails(monkeypatch, caplog):
    """`auto` on a stack where compiling the decode fails: the call still returns the dynamic path's rollouts (same
    seed), logs why, and later calls stay dynamic; an explicit `static_compiled` raises instead."""
    import tokenrl.rollout.hf as hf

    model, dynamic, _ = engines()
    auto = HFEngine(model, dynamic.tokenizer)
    monkeypatch.setattr(auto, "decoding_on", lambda device: "static_compiled" if auto.decoding == "auto" else "dynamic")

    def broken(**kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(hf, "CompileConfig", broken)
    with caplog.at_level("WARNING", logger="tokenrl.rollout.hf"):
        same_batch(generate(dynamic, PROMPTS, seed=2), generate(auto, PROMPTS, seed=2))
    assert auto.decoding == "dynamic" and auto._cache is None and "no compiler here" in caplog.text
    with pytest.raises(RuntimeError, match="no compiler here"):
        generate(HFEngine(model, dynamic.tokenizer, decoding="static_compiled"), PROMPTS)


def test_the_engine_a_run_builds_decodes_as_its_config_says():
    from tokenrl.records.settings import RolloutSettings
    from tokenrl.rollout import build_engine

    model, tok = tiny_policy()
    node = OmegaConf.to_container(compose_config(["rollout=hf"]).rollout, resolve=True)
    assert build_engine(RolloutSettings.of({**node, "decoding": "static"}), model, tok).decoding == "static"
    without = RolloutSettings.of({key: value for key, value in node.items() if key != "decoding"})
    assert build_engine(without, model, tok).decoding == "auto"  # a node without the key
