"""Per-request sampling seeds (``sampling_params["seed"]``) on both engines of HFServerManager.

A seeded request's tokens must depend only on its prompt, sampling settings, seed and the weights:
not on its batch-mates, their order, the batches the server ran before, or the server's ``seed``.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from verl.workers.rollout.replica import TokenOutput

from seal.engine.hf_server import HFServerManager, parse_sampling_params, sample_categorical

from tiny_lm import VOCAB, _Tok, gather, tiny_model

ENGINES = {"kv_cache": 4096, "hf_generate": 0}  # prefix_cache_tokens
HOT = {"temperature": 1.5, "top_k": 100, "top_p": 0.95}  # spread out: equal samples by chance are negligible
TARGET = ([5, 6, 7, 8, 9, 10, 11], {**HOT, "max_tokens": 16, "seed": 1234})
# Batch-mates: other seeds, no seed, shorter limits (they finish first and leave the decode batch).
MATES = [([12, 13], {**HOT, "max_tokens": 3, "seed": 99}), ([14, 15, 16, 17], {**HOT, "max_tokens": 5}),
         ([5, 6, 7, 30], {**HOT, "max_tokens": 2, "seed": 7})]


def model_without_eos() -> torch.nn.Module:
    model = tiny_model()
    model.generation_config.eos_token_id = VOCAB + 10  # unreachable: every row runs to its limit
    return model


def serve(server: HFServerManager, requests: list[tuple[list[int], dict]]) -> list[TokenOutput]:
    """All ``requests`` at once (one batch when they share sampling settings), each with its own params."""
    async def go() -> list[TokenOutput]:
        return list(await asyncio.gather(*(server.generate(f"r{i}", p, dict(sp))
                                           for i, (p, sp) in enumerate(requests))))

    return asyncio.run(go())


def assert_same(a: TokenOutput, b: TokenOutput) -> None:
    assert a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
def test_seeded_request_ignores_batch_mates_history_and_server_seed(engine: str) -> None:
    model = model_without_eos()
    n = ENGINES[engine]
    alone_server = HFServerManager(model, _Tok(), autocast_dtype=None, seed=3, prefix_cache_tokens=n)
    alone = serve(alone_server, [TARGET])[0]
    assert len(alone.token_ids) == 16
    # Another server seed, two earlier batches, then the target last behind three batch-mates.
    busy = HFServerManager(model, _Tok(), autocast_dtype=None, seed=41, prefix_cache_tokens=n)
    serve(busy, MATES)
    gather(busy, [[20, 21, 22], [5, 6]], {**HOT, "max_tokens": 6})
    together = serve(busy, MATES[::-1] + [TARGET])
    assert busy.stats.batch_sizes[-1] == 4  # different seeds did not split the batch
    assert_same(together[-1], alone)
    # No server seed at all (the global RNG for unseeded rows), target first this time.
    free = HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=n)
    assert_same(serve(free, [TARGET] + MATES)[0], alone)


@pytest.mark.parametrize("engine", ENGINES)
def test_different_seeds_differ_same_seed_repeats(engine: str) -> None:
    server = HFServerManager(model_without_eos(), _Tok(), autocast_dtype=None, prefix_cache_tokens=ENGINES[engine])
    prompt, params = TARGET
    outs = serve(server, [(prompt, {**params, "seed": 1}), (prompt, {**params, "seed": 2}),
                          (prompt, {**params, "seed": 1})])
    assert server.stats.batch_sizes == [3]
    assert outs[0].token_ids != outs[1].token_ids
    assert_same(outs[0], outs[2])  # two rows with one seed: the same stream each


def test_both_engines_draw_the_same_tokens_for_a_seed() -> None:
    """The generate engine samples seeded rows as the prefix-reuse engine does (its greedy pick
    of a per-row draw is exact), so a seed means the same answer on either engine."""
    model = model_without_eos()
    outs = [serve(HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=n), [TARGET] + MATES)
            for n in ENGINES.values()]
    for i in (0, 1, 3):  # the seeded rows (row 2 has no seed: HF draws it by another method)
        assert outs[0][i].token_ids == outs[1][i].token_ids
        assert torch.allclose(torch.tensor(outs[0][i].log_probs), torch.tensor(outs[1][i].log_probs), atol=1e-4)


def test_seeding_one_request_leaves_unseeded_batch_mates_alone() -> None:
    """Prefix-reuse engine, server seed set: unseeded rows draw exactly what they drew before, even
    when a batch-mate brings its own seed."""
    model = model_without_eos()
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = {**HOT, "max_tokens": 8}
    plain = serve(HFServerManager(model, _Tok(), autocast_dtype=None, seed=5), [(p, params) for p in prompts])
    mixed = serve(HFServerManager(model, _Tok(), autocast_dtype=None, seed=5),
                  [(prompts[0], params), (prompts[1], {**params, "seed": 77}), (prompts[2], params)])
    assert_same(plain[0], mixed[0])
    assert_same(plain[2], mixed[2])
    assert plain[1].token_ids != mixed[1].token_ids


@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_ignores_the_seed(engine: str) -> None:
    server = HFServerManager(model_without_eos(), _Tok(), autocast_dtype=None, prefix_cache_tokens=ENGINES[engine])
    greedy = {"temperature": 0, "max_tokens": 6}
    outs = serve(server, [([5, 6, 7], {**greedy, "seed": 1}), ([5, 6, 7], {**greedy, "seed": 2}), ([5, 6, 7], greedy)])
    assert outs[0].token_ids == outs[1].token_ids == outs[2].token_ids


def test_row_generators_make_a_row_independent_of_the_others() -> None:
    probs = torch.softmax(torch.randn(4, 50), dim=-1)
    gens = [None, torch.Generator().manual_seed(8), None, torch.Generator().manual_seed(9)]
    draws = sample_categorical(probs, torch.Generator().manual_seed(0), gens)
    alone = [sample_categorical(probs[i:i + 1], None, [torch.Generator().manual_seed(s)])
             for i, s in ((1, 8), (3, 9))]
    assert draws[1] == alone[0][0] and draws[3] == alone[1][0]
    shared = sample_categorical(probs, torch.Generator().manual_seed(0))  # unseeded rows: the shared stream's draw
    assert draws[0] == shared[0] and draws[2] == shared[2]
    before = torch.random.get_rng_state()
    sample_categorical(probs[1:2], None, [torch.Generator().manual_seed(8)])
    assert torch.equal(torch.random.get_rng_state(), before)  # every row seeded: the global RNG is untouched


@pytest.mark.parametrize("seed", [-1, 1.5, 3.0, "3", True, 2**64])
def test_bad_seed_is_refused(seed: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        parse_sampling_params({"seed": seed}, 8)
    server = HFServerManager(tiny_model(), _Tok(), autocast_dtype=None)
    with pytest.raises(ValueError, match="seed"):
        serve(server, [([3, 4], {"max_tokens": 2, "seed": seed})])


def test_seed_parsed_with_the_settings() -> None:
    assert parse_sampling_params({"seed": 5}, 8)[2] == 5
    assert parse_sampling_params({"seed": None}, 8)[2] is None and parse_sampling_params({}, 8)[2] is None
    assert parse_sampling_params({"seed": 5}, 8)[0] == parse_sampling_params({"seed": 6}, 8)[0]  # one batch key
