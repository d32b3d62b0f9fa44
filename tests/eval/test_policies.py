"""Chat policies: OpenAI-compatible client (retries, bounded concurrency), local HF batching."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from seal.eval.policies import (
    ContextOverflowError,
    HFChatPolicy,
    OpenAIChatPolicy,
    PolicyError,
    SamplingSettings,
    complete_with_usage,
)

ROOT = Path(__file__).resolve().parents[2]
SMOL = ROOT / "models" / "SmolLM2-135M-Instruct"
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]


def _ok(text: str = "hello") -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": text},
                                                  "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 11, "completion_tokens": 2}})


def test_openai_request_body_usage_and_retries():
    seen, statuses = [], [503, 429, 200]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        code = statuses.pop(0)
        return _ok() if code == 200 else httpx.Response(code, text="busy")

    pol = OpenAIChatPolicy("http://x/v1", "m", api_key="k", max_retries=2, backoff_s=0.0,
                           transport=httpx.MockTransport(handler))
    out = complete_with_usage(pol, MSGS, SamplingSettings(seed=3, max_tokens=7))
    assert out.text == "hello" and out.prompt_tokens == 11 and out.completion_tokens == 2
    assert len(seen) == 3 and seen[0].url.path == "/v1/chat/completions"
    body = httpx.Request("POST", "http://x", content=seen[0].content).read()
    import json
    payload = json.loads(body)
    assert payload["temperature"] == 0.0 and payload["seed"] == 3 and payload["max_tokens"] == 7
    assert seen[0].headers["authorization"] == "Bearer k"


def test_openai_gives_up_and_does_not_retry_client_errors():
    calls = []

    def always(code):
        def handler(request):
            calls.append(code)
            return httpx.Response(code, text="nope")
        return handler

    pol = OpenAIChatPolicy("http://x/v1", "m", max_retries=2, backoff_s=0.0, transport=httpx.MockTransport(always(500)))
    with pytest.raises(PolicyError, match="after 3 attempts"):
        pol.complete(MSGS, SamplingSettings())
    assert calls == [500, 500, 500]
    calls.clear()
    pol = OpenAIChatPolicy("http://x/v1", "m", max_retries=2, backoff_s=0.0, transport=httpx.MockTransport(always(400)))
    with pytest.raises(PolicyError, match="HTTP 400"):
        pol.complete(MSGS, SamplingSettings())
    assert calls == [400]


def test_openai_concurrency_is_bounded():
    active, peak, lock = [0], [0], threading.Lock()

    def handler(request):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return _ok()

    pol = OpenAIChatPolicy("http://x/v1", "m", max_concurrency=2, transport=httpx.MockTransport(handler))
    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(lambda _: pol.complete(MSGS, SamplingSettings()), range(6))) == ["hello"] * 6
    assert peak[0] == 2


def test_sampling_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(temperature=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingSettings(max_tokens=0)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template."""
    if not (SMOL / "tokenizer.json").exists():
        pytest.skip("SmolLM2 checkpoint not prepared (install.sh writes models/SmolLM2-135M-Instruct)")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(SMOL)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    out = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.slow
def test_hf_policy_batched_equals_single_and_counts_tokens(tiny_checkpoint):
    pol = HFChatPolicy(str(tiny_checkpoint), max_batch_size=4, batch_wait_s=0.2)
    s = SamplingSettings(max_tokens=6)
    prompts = [MSGS, [{"role": "user", "content": "A much longer question about the file system?"}], MSGS]
    single = [complete_with_usage(pol, p, s) for p in prompts]
    with ThreadPoolExecutor(3) as ex:
        batched = list(ex.map(lambda p: complete_with_usage(pol, p, s), prompts))
    assert [c.text for c in batched] == [c.text for c in single]
    assert pol.server.stats.batch_sizes[:3] == [1, 1, 1] and max(pol.server.stats.batch_sizes[3:]) > 1
    assert single[0].prompt_tokens == pol.count_tokens(MSGS) > 5
    assert all(0 < c.completion_tokens <= 6 for c in single)
    assert all(c.finish_reason in ("stop", "length") for c in single)
    with pytest.raises(ContextOverflowError, match="context length 512"):
        pol.complete([{"role": "user", "content": "word " * 600}], s)
    pol.close()


@pytest.mark.slow
def test_hf_prefix_cache_gives_the_same_greedy_text(tiny_checkpoint):
    plain = HFChatPolicy(str(tiny_checkpoint), prefix_cache_tokens=0)  # one padded generate per batch
    cached = HFChatPolicy(str(tiny_checkpoint))
    assert plain.server.prefix_cache is None and cached.server.prefix_cache is not None
    s = SamplingSettings(max_tokens=5)
    convo = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "List the files."}]
    for turn in range(3):
        a, b = plain.complete(convo, s), cached.complete(convo, s)
        assert a == b, turn
        convo = convo + [{"role": "assistant", "content": a}, {"role": "user", "content": f"result {turn}"}]
    store = cached.server.prefix_cache
    assert store.hits == 2 and store.reused_tokens > cached.count_tokens(convo[:2])  # calls 2 and 3 reused


def test_openai_context_overflow_is_its_own_error():
    def handler(request):
        return httpx.Response(400, json={"error": {"message": "This model's maximum context length is 16384 tokens."}})

    pol = OpenAIChatPolicy("http://x/v1", "m", transport=httpx.MockTransport(handler))
    with pytest.raises(ContextOverflowError, match="maximum context length"):
        pol.complete(MSGS, SamplingSettings())


def test_hf_policy_arguments_map_onto_the_engine(tiny_checkpoint):
    pol = HFChatPolicy(str(tiny_checkpoint), prefix_cache_tokens=1024, max_batch_tokens=300, max_batch_size=3)
    assert pol.server.prefix_cache.max_tokens == 1024
    assert pol.server.prefill_token_budget == 300 and pol.server.max_batch_size == 3
    with pytest.raises(ValueError, match="must be >= 0"):
        HFChatPolicy(str(tiny_checkpoint), prefix_cache_tokens=-1)
    with pytest.raises(ValueError, match="vLLM"):
        HFChatPolicy(str(tiny_checkpoint), device="cuda")
