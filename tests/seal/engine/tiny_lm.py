"""A tiny random Llama (grouped-query: 2 query heads, 1 key/value head) and helpers for server tests."""

from __future__ import annotations

import asyncio

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from verl.workers.rollout.replica import TokenOutput

from seal.engine.hf_server import HFServerManager
from seal.engine.kv_engine import PrefillItem, prefill_padded

VOCAB = 256
EOS = 2


class _Tok:
    pad_token_id = 0
    eos_token_id = 1  # deliberately different: the generation config's eos must win


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      eos_token_id=EOS, pad_token_id=0, bos_token_id=1)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = EOS
    return model


def gather(server: HFServerManager, prompts: list[list[int]], params: dict) -> list[TokenOutput]:
    async def go() -> list[TokenOutput]:
        return list(await asyncio.gather(*(server.generate(f"r{i}", p, dict(params)) for i, p in enumerate(prompts))))

    return asyncio.run(go())


def prefill(model, shape, tokens: list[int], entry, reuse: int):
    """One context's prefill reusing ``entry``'s first ``reuse`` positions: (its entry, next-token logits)."""
    return prefill_padded(model, shape, [PrefillItem(tokens, entry, reuse)])[0]
