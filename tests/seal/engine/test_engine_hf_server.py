"""HFServerManager on a tiny random Llama: batching, log-probs, limits, seeds, weight sharing."""

from __future__ import annotations

import asyncio

import pytest
import torch
from verl.workers.rollout.replica import TokenOutput

from seal.engine.hf_server import HFServerManager, _Request, filter_scores, parse_sampling_params, sample_categorical
from seal.engine.kv_cache import Entry, KVShape, PrefixStore
from seal.engine.kv_engine import PrefillItem, prefill_many, prefill_padded

from tiny_lm import EOS, VOCAB, _Tok, gather, prefill, tiny_model


def reference_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
ENGINES = {"kv_cache": 4096, "hf_generate": 0}  # prefix_cache_tokens


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_one_batch_and_exact_logprobs(temperature: float, engine: str) -> None:
    model = tiny_model()
    server = HFServerManager(model, _Tok(), autocast_dtype=None, batch_wait_ms=20, seed=3,
                             prefix_cache_tokens=ENGINES[engine])
    outs = gather(server, PROMPTS, {"temperature": temperature, "max_tokens": 12})
    assert server.stats.batches == 1 and server.stats.batch_sizes == [3]
    for prompt, out in zip(PROMPTS, outs):
        assert 1 <= len(out.token_ids) <= 12 and len(out.log_probs) == len(out.token_ids)
        assert out.stop_reason in ("completed", "length")
        ref = reference_logprobs(model, prompt, out.token_ids, temperature or 1.0)
        assert torch.allclose(torch.tensor(out.log_probs), ref, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_batched_greedy_matches_one_at_a_time(engine: str) -> None:
    model = tiny_model()
    n = ENGINES[engine]
    together = gather(HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=n), PROMPTS,
                      {"temperature": 0, "max_tokens": 8})
    alone = HFServerManager(model, _Tok(), autocast_dtype=None, max_batch_size=1, prefix_cache_tokens=n)
    singles = [gather(alone, [p], {"temperature": 0, "max_tokens": 8})[0] for p in PROMPTS]
    assert [o.token_ids for o in together] == [o.token_ids for o in singles]
    assert alone.stats.batch_sizes == [1, 1, 1]


@pytest.mark.parametrize("engine", ENGINES)
def test_per_request_max_tokens_and_sampling_groups(engine: str) -> None:
    model = tiny_model()
    model.generation_config.eos_token_id = VOCAB + 10  # unreachable: every row runs to its limit

    async def go(server: HFServerManager) -> list[TokenOutput]:
        return list(await asyncio.gather(
            server.generate("a", PROMPTS[0], {"temperature": 0, "max_tokens": 3}),
            server.generate("b", PROMPTS[1], {"temperature": 0, "max_new_tokens": 9}),
            server.generate("c", PROMPTS[2], {"temperature": 1.0, "top_k": 5, "max_tokens": 4})))

    server = HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=ENGINES[engine])
    a, b, c = asyncio.run(go(server))
    assert [len(a.token_ids), len(b.token_ids), len(c.token_ids)] == [3, 9, 4]
    assert {a.stop_reason, b.stop_reason, c.stop_reason} == {"length"}
    assert sorted(server.stats.batch_sizes) == [1, 2]  # greedy pair together, the sampled one apart


def test_stops_at_generation_config_eos() -> None:
    req = _Request("r", [1], parse_sampling_params({"max_tokens": 5}, 8)[0], 5, None)  # type: ignore[arg-type]
    out = HFServerManager._trim(req, [7, 8, EOS, 0, 0, 0], [-1.0] * 6, {EOS})
    assert out.token_ids == [7, 8, EOS] and out.stop_reason == "completed" and len(out.log_probs) == 3
    out = HFServerManager._trim(req, [7, 8, 9, 10, 11, EOS], [-1.0] * 6, {EOS})
    assert out.token_ids == [7, 8, 9, 10, 11] and out.stop_reason == "length"
    server = HFServerManager(tiny_model(), _Tok(), autocast_dtype=None)
    assert server.eos_ids == [EOS]


@pytest.mark.parametrize("engine", ENGINES)
def test_seed_repeats_and_leaves_global_rng_alone(engine: str) -> None:
    model = tiny_model()
    params = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "max_tokens": 10}
    n = ENGINES[engine]
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = gather(HFServerManager(model, _Tok(), autocast_dtype=None, seed=7, prefix_cache_tokens=n), PROMPTS, params)
    assert torch.equal(torch.rand(1), before)  # the trainer's RNG did not move
    second = gather(HFServerManager(model, _Tok(), autocast_dtype=None, seed=7, prefix_cache_tokens=n), PROMPTS, params)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]


def test_shared_module_sees_updates_private_copy_needs_update_weights() -> None:
    model = tiny_model()
    shared = HFServerManager(model, _Tok(), autocast_dtype=None)
    private = HFServerManager(model, _Tok(), dtype=torch.bfloat16)
    assert shared.model is model and private.model is not model
    assert next(private.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    assert torch.equal(shared.model.lm_head.weight, model.lm_head.weight)
    assert not torch.allclose(private.model.lm_head.weight.float(), model.lm_head.weight, atol=1e-2)
    private.update_weights(model)
    assert torch.allclose(private.model.lm_head.weight.float(), model.lm_head.weight, atol=1e-2)
    model.train()
    gather(shared, PROMPTS[:1], {"temperature": 0, "max_tokens": 2})
    assert model.training  # the training flag is restored after generation
    out = gather(private, PROMPTS[:1], {"temperature": 0, "max_tokens": 4})[0]
    assert len(out.token_ids) >= 1


def test_bad_requests() -> None:
    server = HFServerManager(tiny_model(), _Tok(), autocast_dtype=None)
    with pytest.raises(ValueError, match="temperature"):
        parse_sampling_params({"temperature": -1}, 8)
    with pytest.raises(ValueError, match="max_tokens"):
        parse_sampling_params({"max_tokens": 0}, 8)
    with pytest.raises(ValueError, match="no room"):
        gather(server, [[3] * 128], {"max_tokens": 4})
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(server.generate("x", [3], {}, image_data=[1]))
    # A prompt near the context end gets its max_tokens cut to the room left.
    out = gather(server, [[3] * 125], {"temperature": 0, "max_tokens": 50})[0]
    assert len(out.token_ids) <= 3


def test_prefix_reuse_gives_the_same_answer_as_full_recompute() -> None:
    model = tiny_model()
    cached = HFServerManager(model, _Tok(), autocast_dtype=None)
    full = HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=0)
    greedy = {"temperature": 0, "max_tokens": 6}
    first = gather(cached, PROMPTS[:2], greedy)
    # The next turn of each "episode": its context plus the answer plus an observation.
    follow = [p + o.token_ids + [40, 41, 42] for p, o in zip(PROMPTS[:2], first)]
    hits = cached.prefix_cache.hits
    again = gather(cached, follow, greedy)
    assert cached.prefix_cache.hits == hits + 2 and cached.prefix_cache.reused_tokens > 0
    assert model.config._attn_implementation == "sdpa"  # the decode attention was switched back
    reference = gather(full, follow, greedy)
    for a, r in zip(again, reference):
        assert a.token_ids == r.token_ids
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(r.log_probs), atol=1e-4)
    cached.update_weights(model)
    assert cached.prefix_cache.tokens == 0  # new weights invalidate the cached key/values
    gather(cached, follow[:1], greedy)
    assert cached.prefix_cache.tokens > 0
    with torch.no_grad():  # an optimizer-style in-place update of the shared module...
        model.model.norm.weight.mul_(1.5)
    after = gather(cached, follow[:1], greedy)[0]  # ...is noticed: nothing stale is reused
    fresh = gather(HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=0), follow[:1], greedy)[0]
    assert torch.allclose(torch.tensor(after.log_probs), torch.tensor(fresh.log_probs), atol=1e-4)


def _entry(tokens: list[int]) -> Entry:
    return Entry(torch.tensor(tokens), [torch.zeros(1, len(tokens), 2)], [torch.zeros(1, len(tokens), 2)])


def test_prefix_store_lookup_replace_and_evict() -> None:
    store = PrefixStore(max_tokens=10)
    store.put(_entry([1, 2, 3]))
    entry, n = store.lookup(torch.tensor([1, 2, 3, 4]))
    assert n == 3 and entry is not None
    assert store.lookup(torch.tensor([1, 2, 3]))[1] == 2  # at least one token is always computed
    assert store.lookup(torch.tensor([9, 9]))[0] is None
    store.put(_entry([1, 2, 3, 4, 5]))  # extends [1, 2, 3]: replaces it
    assert [len(e) for e in store.entries] == [5]
    store.put(_entry([7, 8, 9]))
    store.lookup(torch.tensor([1, 2, 3, 4, 5, 6]))  # touch the first: the other one is older now
    store.put(_entry([6, 6, 6, 6]))  # 12 tokens > 10: the least recently used goes
    assert sorted(len(e) for e in store.entries) == [4, 5]


def test_filter_scores() -> None:
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_scores(scores, 2, 1.0)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_scores(scores, -1, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_scores(scores, -1, 0.4)).tolist() == [[False, True, True, True]]


def test_sample_categorical_draws_from_the_distribution() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 1.0, 0.0]]).repeat(10000, 1)
    draws = sample_categorical(probs, torch.Generator().manual_seed(0))
    first = torch.bincount(draws[0::2], minlength=4) / 10000
    assert torch.allclose(first, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.02) and first[3] == 0
    assert (draws[1::2] == 2).all()  # zero-probability tokens are never drawn
    again = sample_categorical(probs, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_autocast_engines_agree() -> None:
    """Under bf16 autocast (the local trainer's setting) the cached engine matches model.generate."""
    model = tiny_model()
    greedy = {"temperature": 0, "max_tokens": 6}
    answers = []
    for tokens in (4096, 0):
        server = HFServerManager(model, _Tok(), autocast_dtype=torch.bfloat16, prefix_cache_tokens=tokens)
        first = gather(server, PROMPTS, greedy)
        answers.append(gather(server, [p + o.token_ids + [40] for p, o in zip(PROMPTS, first)], greedy))
    assert [o.token_ids for o in answers[0]] == [o.token_ids for o in answers[1]]
    for a, b in zip(*answers):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=2e-2)


def test_padded_prefill_equals_one_row_at_a_time() -> None:
    """Rows with different cached lengths (and none) prefilled in one forward: same logits and
    key/values as the single-row path and as a full forward without cache."""
    model = tiny_model().eval()
    shape = KVShape.of(model.config, torch.float32)
    base = list(range(3, 40))
    with torch.no_grad():
        stored, _ = prefill(model, shape, base, None, 0)
        items = [PrefillItem(base + [50, 51, 52], stored, len(base)), PrefillItem(base[:20] + [60] * 9, stored, 20),
                 PrefillItem([7, 8, 9, 10, 11], None, 0), PrefillItem(base + [70], stored, len(base))]
        together = prefill_padded(model, shape, items)
        assert [len(e) for e, _ in prefill_many(model, shape, items)] == [len(it.tokens) for it in items]
        for it, (entry, logits) in zip(items, together):
            single, single_logits = prefill(model, shape, it.tokens, it.entry, it.reuse)
            full = model(torch.tensor([it.tokens])).logits[0, -1]
            assert entry.tokens.tolist() == it.tokens
            assert torch.allclose(logits, single_logits, atol=1e-5) and torch.allclose(logits, full, atol=1e-5)
            (ek, ev), (sk, sv) = entry.materialize(), single.materialize()
            for a, b in zip(ek + ev, sk + sv):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_batched_follow_up_calls_match_one_at_a_time() -> None:
    """Episodes' next calls (cached prefixes of different lengths) in one batch give the same tokens
    and log-probs as one at a time; a group sharing a new prompt computes it once."""
    model = tiny_model()
    greedy = {"temperature": 0, "max_tokens": 6}
    shared = list(range(3, 63))  # longer than WAIT_FOR_SHARED_MIN
    prompts = [shared + [40], shared + [41], shared + [42, 43], [5, 6, 7]]
    outs = []
    for batch_size in (8, 1):
        server = HFServerManager(model, _Tok(), autocast_dtype=None, max_batch_size=batch_size)
        first = (gather(server, prompts, greedy) if batch_size > 1
                 else [gather(server, [p], greedy)[0] for p in prompts])
        if batch_size > 1:  # the three siblings reused the first one's prefix, computed once
            assert server.prefix_cache.reused_tokens >= 2 * len(shared)
            assert 0 < server.stats.prefill_seconds and 0 < server.stats.decode_seconds
            assert server.stats.prefill_seconds + server.stats.decode_seconds <= server.stats.generate_seconds
        follow = [p + o.token_ids + [60 + i] * (i + 1) for i, (p, o) in enumerate(zip(prompts, first))]
        again = (gather(server, follow, greedy) if batch_size > 1
                 else [gather(server, [p], greedy)[0] for p in follow])
        outs.append(first + again)
    for a, b in zip(*outs):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES)
def test_server_on_one_gpu_matches_cpu(engine: str) -> None:
    """The local trainer's one-GPU mode: inputs, cache buffers and autocast follow the model's
    device (shared-prefix attention is CPU-only and stays off there)."""
    greedy = {"temperature": 0, "max_tokens": 6}
    shared = list(range(3, 63))
    prompts = [shared + [40], shared + [41], [5, 6, 7]]
    outs = []
    for device in ("cpu", "cuda"):
        server = HFServerManager(tiny_model().to(device), _Tok(), autocast_dtype=None,
                                 prefix_cache_tokens=ENGINES[engine], shared_prefix_min_tokens=16)
        first = gather(server, prompts, greedy)
        follow = [p + o.token_ids + [50] for p, o in zip(prompts, first)]
        outs.append(first + gather(server, follow, greedy))
    for a, b in zip(*outs):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-3)
