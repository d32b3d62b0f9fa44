"""Which models the prefix-reuse engine accepts: the ones whose attention it computes as they do.

The engine builds its own attention masks and reads a shared prefix without a mask, so a model
with sliding-window layers (Gemma 3, Mistral v0.1), attention softcapping (Gemma 2) or an
architecture it was never checked against must be refused with one ``ConfigError`` line when the
server is built; every architecture it accepts must generate exactly what ``model.generate``
does, past a shared prefix and the KV cache's reuse (tiny random models, no downloads).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers import PretrainedConfig

from seal.config import ConfigError
from seal.engine.hf_server import HFServerManager
from seal.engine.kv_engine import SUPPORTED_MODEL_TYPES, unsupported_attention

from tiny_lm import _Tok, gather, tiny_model

SMALL = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, eos_token_id=2, pad_token_id=0, bos_token_id=1)

# model type -> (config class, model class, settings beyond SMALL); every supported type is here.
ACCEPTED = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": None}),
}

# name -> (config class, model class, settings, words the message must hold)
REFUSED = {
    "gemma3_sliding_layers": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                              {"head_dim": 16, "sliding_window": 512, "max_position_embeddings": 32768,
                               "layer_types": ["sliding_attention", "full_attention"]},
                              ["'gemma3_text'", "'sliding_attention'", "sliding_window=512"]),
    "mistral_sliding_window": ("MistralConfig", "MistralForCausalLM",
                               {"sliding_window": 4096, "max_position_embeddings": 32768},
                               ["'mistral'", "sliding-window", "sliding_window=4096"]),
    "qwen2_sliding_layers": ("Qwen2Config", "Qwen2ForCausalLM",
                             {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1,
                              "max_position_embeddings": 4096},
                             ["'qwen2'", "'sliding_attention'"]),
    "gemma2_softcapping": ("Gemma2Config", "Gemma2ForCausalLM",
                           {"head_dim": 16, "attn_logit_softcapping": 50.0,
                            "layer_types": ["full_attention", "full_attention"]},
                           ["'gemma2'", "softcapping"]),
    "gpt2_not_implemented": ("GPT2Config", "GPT2LMHeadModel",
                             {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 256, "bos_token_id": 1,
                              "eos_token_id": 2},
                             ["'gpt2'", "outside those the engine implements"]),
}


def build(config_class: str, model_class: str, settings: dict[str, Any]) -> torch.nn.Module:
    """A tiny random model of that class (GPT-2 takes its own size names, not SMALL's)."""
    torch.manual_seed(0)
    base = {} if config_class == "GPT2Config" else dict(SMALL, max_position_embeddings=256)
    config: PretrainedConfig = getattr(transformers, config_class)(**{**base, **settings})
    config._attn_implementation = "sdpa"
    model = getattr(transformers, model_class)(config)
    model.generation_config.eos_token_id = 300  # unreachable: every row runs to its limit
    return model


@pytest.mark.parametrize("name", REFUSED)
def test_refused_with_one_line_naming_key_type_feature_and_fix(name: str) -> None:
    config_class, model_class, settings, words = REFUSED[name]
    model = build(config_class, model_class, settings)
    model.config._name_or_path = "models/some-model"
    with pytest.raises(ConfigError) as caught:
        HFServerManager(model, _Tok(), autocast_dtype=None)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("actor_rollout_ref.model.path=models/some-model: model type ")
    for word in words + ["full causal attention", "trainer.backend=verl"]:
        assert word in message, (word, message)
    # The model.generate engine runs whatever the model implements, so it is not refused.
    HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=0)


def test_every_supported_type_is_held_to_model_generate() -> None:
    assert sorted(ACCEPTED) == sorted(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", ACCEPTED)
def test_accepted_types_generate_what_model_generate_does(model_type: str) -> None:
    """Two prompts sharing a 50-token prefix (read once, as a shared prefix) and a follow-up call
    reusing the cache: greedy tokens and log-probs equal the ``model.generate`` engine's."""
    model = build(*ACCEPTED[model_type])
    assert model.config.model_type == model_type and unsupported_attention(model.config) is None
    prompts = [list(range(3, 60)), list(range(3, 53)) + [7, 8, 9]]
    greedy = {"temperature": 0, "max_tokens": 10}
    cached = HFServerManager(model, _Tok(), autocast_dtype=None, shared_prefix_min_tokens=16)
    full = HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=0)
    first = gather(cached, prompts, greedy)
    follow = [p + o.token_ids + [40, 41] for p, o in zip(prompts, first)]
    for ours, reference in zip(first + gather(cached, follow, greedy), gather(full, prompts + follow, greedy)):
        assert ours.token_ids == reference.token_ids
        assert torch.allclose(torch.tensor(ours.log_probs), torch.tensor(reference.log_probs), atol=1e-4)
    assert cached.prefix_cache.hits >= 2


def test_a_window_as_wide_as_the_context_is_full_attention() -> None:
    model = tiny_model()  # the llama every other engine test uses is accepted
    HFServerManager(model, _Tok(), autocast_dtype=None)
    wide = build("MistralConfig", "MistralForCausalLM", {"sliding_window": 256})  # = max_position_embeddings
    assert unsupported_attention(wide.config) is None
    HFServerManager(wide, _Tok(), autocast_dtype=None)
