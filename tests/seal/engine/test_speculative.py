"""Prompt-lookup speculative decoding (seal.engine.speculative): exact against plain decoding.

* Greedy: the same tokens, stop reasons and (to float tolerance) log-probs with and without it, on a
  tiny random Llama and on the real SmolLM2 checkpoint, with rows of different lengths finishing at
  different steps (and leaving the batch), limits hit, a stop id inside an accepted draft and
  shared-prefix groups.
* Sampled: the distribution of 3-token answers over thousands of seeds equals the target's exact
  distribution (enumerated), speculating or not, while three deliberately wrong variants of the
  acceptance rule fail the same test (its power); and a seeded answer is the same tokens either way.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from verl.workers.rollout.replica import TokenOutput

from seal.engine import sampling, speculative
from seal.engine.draft_policy import DraftPolicy
from seal.engine.hf_server import HFServerManager
from seal.engine.ngram import NgramIndex
from seal.engine.sampling import SamplingKey, hinted_draw, target_probs
from seal.engine.speculative import SpeculativeSettings

from tiny_lm import EOS, _Tok, tiny_model

SMOL = Path(__file__).resolve().parents[3] / "models" / "SmolLM2-135M-Instruct"
OFF = SpeculativeSettings(enable=False)
ON = SpeculativeSettings(max_draft=6)


class AlwaysDraft(DraftPolicy):
    """Verifies every draft prompt lookup offers (the server's own policy drafts only where it
    expects to gain, which at batch 100 is hardly ever): the tests must exercise the drafts."""

    def width(self, chains, states, batch):  # noqa: ANN001, ANN201
        return 1 + max(chains, default=0)


def server_for(model: torch.nn.Module, spec: SpeculativeSettings, tokenizer: object = None, **kwargs: object
               ) -> HFServerManager:
    server = HFServerManager(model, tokenizer or _Tok(), autocast_dtype=None, speculative=spec, **kwargs)
    server.draft_policy = AlwaysDraft()
    return server


def serve(server: HFServerManager, requests: list[tuple[list[int], dict]]) -> list[TokenOutput]:
    """All ``requests`` at once (one batch when they share sampling settings)."""
    async def go() -> list[TokenOutput]:
        return list(await asyncio.gather(*(server.generate(f"r{i}", p, dict(sp))
                                           for i, (p, sp) in enumerate(requests))))

    return asyncio.run(go())


def assert_same(a: list[TokenOutput], b: list[TokenOutput], atol: float = 1e-4) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.stop_reason == y.stop_reason
        assert torch.allclose(torch.tensor(x.log_probs), torch.tensor(y.log_probs), atol=atol)


# --- prompt lookup --------------------------------------------------------------------------

def test_lookup_takes_the_most_recent_longest_match() -> None:
    assert NgramIndex([1, 2, 3, 4, 5, 9, 1, 2, 3], 3).predict(5) == [4, 5, 9, 1, 2]
    assert NgramIndex([1, 2, 8, 9, 1, 2, 7, 0, 1, 2], 3).predict(1) == [7]  # most recent "1 2"
    # The 3-gram "5 1 2" wins over the more recent 2-gram "1 2".
    assert NgramIndex([5, 1, 2, 6, 1, 2, 7, 5, 1, 2], 3).predict(1) == [6]
    assert NgramIndex([1, 2, 3], 3).predict(4) == []  # the last gram has no earlier occurrence
    assert NgramIndex([4, 4, 4], 3).predict(3) == [4, 4, 4]


def test_chained_prediction_equals_pushing_the_predicted_tokens() -> None:
    """The j-th drafted token is what a look-up predicts once the ones before it are real, so the
    draft and the hint of plain decoding agree position by position."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = torch.randint(0, 4, (int(torch.randint(3, 30, (1,), generator=gen)),), generator=gen).tolist()
        index = NgramIndex(tokens, 3)
        chained = index.predict(6)
        step = NgramIndex(tokens, 3)
        for tok in chained:
            assert step.hint() == tok
            step.push(tok)
        assert len(chained) == 6 or step.hint() == -1


# --- the draw --------------------------------------------------------------------------------

def test_hinted_draw_is_the_target_distribution() -> None:
    """Over a fine grid of uniforms each token's share is its probability, hint or not; a token
    cut by top-p is never drawn, even as the hint."""
    probs = torch.tensor([0.1, 0.0, 0.45, 0.3, 0.15])
    u = (torch.arange(100_000, dtype=torch.float64) + 0.5) / 100_000
    for hint in (-1, 0, 1, 2, 4):
        hints = torch.full((len(u),), hint)
        drawn = hinted_draw(probs.expand(len(u), -1), hints, u)
        share = torch.bincount(drawn, minlength=5).double() / len(u)
        assert torch.allclose(share, probs.double(), atol=2e-5), (hint, share)
        if hint >= 0 and probs[hint] > 0:
            assert bool((drawn[u < float(probs[hint])] == hint).all())  # the hint takes the first stretch


# --- greedy: the same tokens -----------------------------------------------------------------

def spy_groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of the prefix groups each speculative decode starts with."""
    sizes: list[int] = []
    original = speculative.prefix_groups

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        groups, shared = original(*args, **kwargs)
        sizes.extend(len(g.rows) for g in groups)
        return groups, shared

    monkeypatch.setattr(speculative, "prefix_groups", spy)
    return sizes


def repetitive_prompts() -> list[list[int]]:
    """Prompts that repeat themselves (drafts fire), of different lengths, two sharing 20 tokens."""
    loop = [5, 6, 7, 8, 9, 10, 11, 12]
    shared = (loop * 3)[:20]
    return [shared + [30, 31, 5, 6], shared + [40, 5, 6, 7], loop * 2 + [5, 6], [20, 21, 22, 20, 21], [9, 8]]


@pytest.mark.parametrize("min_shared", [8, 0])
def test_greedy_tiny_model_same_with_and_without(min_shared: int, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = spy_groups(monkeypatch)
    model = tiny_model()
    prompts = repetitive_prompts()
    limits = [23, 17, 5, 30, 9]  # rows finish at different steps, several mid-draft limits
    requests = [(p, {"temperature": 0, "max_tokens": m}) for p, m in zip(prompts, limits)]
    outs, stats = {}, {}
    for name, spec in (("off", OFF), ("on", ON), ("k=2", SpeculativeSettings(max_draft=2))):
        server = server_for(model, spec, shared_prefix_min_tokens=min_shared)
        outs[name], stats[name] = serve(server, requests), server.stats
    assert stats["off"].batch_sizes == [5] and stats["off"].drafted_tokens == 0
    assert_same(outs["off"], outs["on"])
    assert_same(outs["off"], outs["k=2"])
    assert stats["on"].accepted_tokens > 0 and stats["on"].decode_steps < stats["off"].decode_steps
    assert (max(groups, default=0) >= 2) == (min_shared > 0)  # the two rows sharing 20 tokens: a group


class CommitSpy:
    """Records every step's new tokens and how many of them a row kept (speculative._commit)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[tuple[list[int], int]] = []
        self._commit = speculative._commit
        monkeypatch.setattr(speculative, "_commit", self)

    def __call__(self, row, new, logprobs, stop_ids):  # noqa: ANN001, ANN204
        kept = self._commit(row, new, logprobs, stop_ids)
        self.steps.append((list(new), kept))
        return kept

    def stop_inside_a_draft(self) -> int | None:
        """A token of a one-row run that first appears as an accepted draft token other than a
        step's last: stopping at it must discard what the step accepted after it."""
        seen: set[int] = set()
        for new, _ in self.steps:
            for i, tok in enumerate(new):
                if i < len(new) - 1 and tok not in seen and tok != EOS:
                    return tok
                seen.add(tok)
        return None

    def discarded(self) -> bool:
        return any(len(new) > kept for new, kept in self.steps)


def test_greedy_stop_id_inside_an_accepted_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's stop id met inside an accepted draft ends the row there: the accepted tokens
    after it are dropped, and the answer is plain decoding's. The prompt holds the start of the
    tiny model's own answer, which then repeats a stretch of its prompt (drafted from it)."""
    model = tiny_model()
    base = [9, 8]
    answer = serve(HFServerManager(model, _Tok(), autocast_dtype=None, speculative=OFF),
                   [(base, {"temperature": 0, "max_tokens": 30})])[0].token_ids
    spy = CommitSpy(monkeypatch)
    for cut in range(len(answer)):  # the first prompt whose answer meets a new token inside a draft
        prompt, spy.steps = base + answer[:cut], []
        serve(server_for(model, ON), [(prompt, {"temperature": 0, "max_tokens": 30})])
        stop = spy.stop_inside_a_draft()
        if stop is not None:
            break
    assert stop is not None
    params = {"temperature": 0, "max_tokens": 30, "stop_token_ids": [stop]}
    spy.steps = []
    outs = {name: serve(server_for(model, spec), [(prompt, params)])[0] for name, spec in (("off", OFF), ("on", ON))}
    assert_same([outs["off"]], [outs["on"]])
    assert outs["on"].stop_reason == "completed" and outs["on"].token_ids[-1] == stop
    assert spy.discarded()


@pytest.mark.skipif(not SMOL.is_dir(), reason="SmolLM2 checkpoint not prepared (install.sh)")
def test_greedy_smollm2_same_with_and_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real checkpoint copying JSON from its prompt: rows of different lengths sharing a
    prefix (a shared-prefix group), one limit hit mid-draft, one stopped by an id met in a draft."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    groups = spy_groups(monkeypatch)
    tok = AutoTokenizer.from_pretrained(SMOL)
    model = AutoModelForCausalLM.from_pretrained(SMOL, dtype=torch.float32)
    record = '{"file": "report_2024.txt", "owner": "alice", "size": 1234, "tags": ["q3", "final"]}'
    asks = [f"The tool returned {record}. Repeat the JSON exactly.", f"Copy this record verbatim: {record}",
            f"The tool returned {record}. Now call move_file with the same file and owner as JSON."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": a}], add_generation_prompt=True) for a in asks]
    prompts = [list(p if isinstance(p, list) else p["input_ids"]) for p in prompts]
    spy = CommitSpy(monkeypatch)
    serve(server_for(model, ON, tok), [(prompts[0], {"temperature": 0, "max_tokens": 40})])
    stop = spy.stop_inside_a_draft()
    assert stop is not None
    params = [{"temperature": 0, "max_tokens": 40}, {"temperature": 0, "max_tokens": 13},
              {"temperature": 0, "max_tokens": 40}]
    outs, stats = {}, {}
    for name, spec in (("off", OFF), ("on", ON)):
        spy.steps = []
        server = server_for(model, spec, tok, shared_prefix_min_tokens=16)
        answers = serve(server, list(zip(prompts, params)))
        stopped = serve(server, [(prompts[0], {"temperature": 0, "max_tokens": 40, "stop_token_ids": [stop]})])
        outs[name], stats[name] = answers + stopped, server.stats
    assert_same(outs["off"], outs["on"])
    assert outs["on"][1].stop_reason == "length" and len(outs["on"][1].token_ids) == 13
    assert outs["on"][3].stop_reason == "completed" and outs["on"][3].token_ids[-1] == stop
    assert stats["on"].accepted_tokens >= 10 and stats["on"].decode_steps < stats["off"].decode_steps
    assert spy.discarded()
    assert max(groups) >= 2  # the prompts' common start was read as a shared prefix


# --- sampled: the same distribution ------------------------------------------------------------

SMALL_VOCAB = 4
DRAW = {"temperature": 0.9, "top_p": 0.9, "max_tokens": 3}  # top-p cuts the least likely token at times
# Ends with "1 2" and holds "1 2 y x" for every y: whatever the first token, a 3-gram predicts the second.
PROMPT = [1, 2, 0, 3, 1, 2, 1, 0, 1, 2, 2, 1, 1, 2, 3, 2, 0, 1, 2]


def small_vocab_model() -> LlamaForCausalLM:
    """A random Llama over 4 tokens whose next-token probabilities are spread (about 0.05-0.6), so
    a draft is accepted about half the time; no stop id is reachable (every answer is 3 tokens)."""
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=None)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    model.generation_config.eos_token_id = SMALL_VOCAB + 10
    return model.eval()


def exact_distribution(model: LlamaForCausalLM) -> torch.Tensor:
    """P(t0, t1, t2) (V^3,) under the processed target (temperature, top-p), by enumeration."""
    v = SMALL_VOCAB
    key = SamplingKey(DRAW["temperature"], DRAW["top_p"], -1, ())
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))
    with torch.no_grad():
        logits = model(torch.cat([torch.tensor(PROMPT).expand(v * v, -1), pairs], dim=1)).logits.float()
    n = len(PROMPT)
    p0 = target_probs(logits[:1, n - 1], key)[0]
    p1 = target_probs(logits[::v, n], key)  # rows with t1 = 0 stand for each t0
    p2 = target_probs(logits[:, n + 1], key).reshape(v, v, v)
    return (p0[:, None, None] * p1[:, :, None] * p2).flatten().double()


def sample_answers(model: LlamaForCausalLM, spec: SpeculativeSettings, n: int, first_seed: int = 0, batch: int = 100
                   ) -> tuple[torch.Tensor, HFServerManager]:
    """Counts of the n answers to :data:`PROMPT` with seeds ``first_seed ..``, 100 to a batch."""
    server = server_for(model, spec, max_batch_size=batch, batch_wait_ms=50)
    counts = torch.zeros(SMALL_VOCAB ** 3, dtype=torch.float64)
    for lo in range(first_seed, first_seed + n, batch):
        for out in serve(server, [(PROMPT, {**DRAW, "seed": s}) for s in range(lo, lo + batch)]):
            a, b, c = out.token_ids
            counts[(a * SMALL_VOCAB + b) * SMALL_VOCAB + c] += 1
    return counts, server


def chi_square_pvalue(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Pearson's goodness of fit; cells expecting under 5 pooled; p-value by Wilson-Hilferty."""
    total = counts.sum()
    expected = expected_p * total
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def wrong_accept_any(u: float, p_draft: float, total: float) -> bool:
    """Wrong: accept a draft whenever the target gives it any probability."""
    return p_draft > 0


def wrong_same_uniform_full_p(probs, hints, u, mass=None):  # noqa: ANN001, ANN201
    """Wrong: after a rejection, draw from the whole p (draft not removed) with the rejected uniform."""
    return sampling.hinted_draw(probs, torch.full_like(hints, -1), u)


def wrong_fresh_uniform_full_p(probs, hints, u, mass=None):  # noqa: ANN001, ANN201
    """Wrong: after a rejection, draw afresh from the whole p (the draft may come back)."""
    return sampling.hinted_draw(probs, torch.full_like(hints, -1), torch.rand(len(u), dtype=torch.float64))


N_SAMPLES = 4000


@pytest.fixture(scope="module")
def small_model_and_exact() -> tuple[LlamaForCausalLM, torch.Tensor]:
    model = small_vocab_model()
    return model, exact_distribution(model)


@pytest.mark.parametrize("spec", [OFF, ON], ids=["plain", "speculative"])
def test_sampled_distribution_is_the_target(spec: SpeculativeSettings, small_model_and_exact) -> None:  # noqa: ANN001
    """Each decoder against the enumerated target, on seeds of its own (with the same seeds both
    draw the same tokens, which another test checks); the test below shows that this one can fail."""
    model, exact = small_model_and_exact
    counts, server = sample_answers(model, spec, N_SAMPLES, first_seed=10**6 if spec.enable else 0)
    assert chi_square_pvalue(counts, exact) > 1e-3
    if spec.enable:  # drafts were exercised both ways: accepted and rejected
        drafted, accepted = server.stats.drafted_tokens, server.stats.accepted_tokens
        assert drafted >= 0.9 * N_SAMPLES and accepted >= 200 and drafted - accepted >= 200


@pytest.mark.parametrize("target,wrong", [("_accepts", wrong_accept_any), ("hinted_draw", wrong_same_uniform_full_p),
                                          ("hinted_draw", wrong_fresh_uniform_full_p)],
                         ids=["accept-any", "no-removal-same-uniform", "no-removal-fresh-uniform"])
def test_wrong_speculative_sampling_fails_the_distribution_test(
        target: str, wrong, small_model_and_exact, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The power of the test above: each wrong rule is caught with a vanishing p-value."""
    model, exact = small_model_and_exact
    monkeypatch.setattr(speculative, target, wrong)
    torch.manual_seed(0)
    counts, _ = sample_answers(model, ON, N_SAMPLES)
    assert chi_square_pvalue(counts, exact) < 1e-6


def test_seeded_sampled_answer_is_the_same_speculating_or_not() -> None:
    """One uniform per token from the row's own generator, the prediction ordered first: the
    speculative decoder draws plain decoding's tokens, whatever the draft length."""
    model = tiny_model()
    model.generation_config.eos_token_id = 10_000  # unreachable: rows run to their limits
    params = {"temperature": 1.2, "top_k": 40, "top_p": 0.95}
    requests = [(p, {**params, "max_tokens": m, "seed": s}) for p, m, s in
                zip(repetitive_prompts(), [20, 7, 25, 12, 16], [11, 12, 13, 14, 15])]
    outs = {name: serve(server_for(model, spec), requests)
            for name, spec in (("off", OFF), ("on", ON), ("k=1", SpeculativeSettings(max_draft=1)))}
    assert_same(outs["off"], outs["on"])
    assert_same(outs["off"], outs["k=1"])
    generate = serve(HFServerManager(model, _Tok(), autocast_dtype=None, prefix_cache_tokens=0), requests)
    assert_same(outs["on"], generate)  # the generate engine orders its draws the same way


# --- settings and reporting --------------------------------------------------------------------

def test_settings_follow_the_schema_and_refuse_bad_values() -> None:
    from omegaconf import OmegaConf

    from seal.schema import schema_default

    assert SpeculativeSettings() == SpeculativeSettings(**schema_default("seal.local.speculative"))
    cfg = OmegaConf.create({"seal": {"local": {"speculative": {"max_draft": 3, "enable": False}}}})
    assert SpeculativeSettings.from_config(cfg) == SpeculativeSettings(enable=False, max_draft=3, ngram=3)
    assert SpeculativeSettings.from_config(OmegaConf.create({})) == SpeculativeSettings()
    for bad in ({"max_draft": 0}, {"ngram": 1}):
        with pytest.raises(ValueError):
            SpeculativeSettings(**bad)


def test_acceptance_is_reported() -> None:
    server = HFServerManager(tiny_model(), _Tok(), autocast_dtype=None)  # speculation on by default
    serve(server, [(p, {"temperature": 0, "max_tokens": 20}) for p in repetitive_prompts()[:3]])
    stats = server.stats.as_dict()
    assert stats["drafted_tokens"] >= stats["accepted_tokens"] > 0 and stats["decode_steps"] > 0
    assert stats["acceptance_rate"] == round(stats["accepted_tokens"] / stats["drafted_tokens"], 3)


# --- the draft policy ------------------------------------------------------------------------

def test_policy_fits_the_step_cost_and_drafts_only_where_it_pays() -> None:
    policy = DraftPolicy()
    assert policy.ratio() == DraftPolicy().prior_ratio  # nothing timed yet
    for n in (8, 16, 40, 64, 8, 112, 32) * 20:  # steps costing 50 ms + 1 ms per position
        policy.observe_step(n, 0.050 + 0.001 * n)
    assert policy.ratio() == pytest.approx(50.0, rel=0.05)
    for k in range(600):  # whole drafts accepted stay right, rejected ones wrong; "some": the first
        policy.observe_drafts("all", 4, 4)  # token a third of the time, never the second
        policy.observe_drafts("none", 4, 0)
        policy.observe_drafts("some", 6, int(k % 3 == 0))
    assert policy.acceptance("all", 2) > 0.9 and policy.acceptance("none", 0) < 0.1
    assert 0.28 < policy.acceptance("some", 0) < 0.38 and policy.acceptance("some", 1) < 0.1
    assert policy.width([6], ["all"], 1) == 7  # one row, drafts that hold: verify them all
    assert policy.width([6] * 32, ["all"] * 32, 32) == 7  # ... even 32 rows of them
    assert policy.width([6], ["none"], 1) == 1  # drafts that fail: not worth a position
    assert policy.width([6], ["some"], 1) == 2  # only the first token stands a chance
    # 32 rows, each position costing 32/50 of a step: a third of a token per row does not pay.
    assert policy.width([6] * 32, ["some"] * 32, 32) == 1
    assert policy.width([6] * 32, ["some"] * 8 + ["all"] * 24, 32) == 7
    assert policy.width([0, 0], ["start", "start"], 2) == 1


def test_learned_policy_gives_the_same_tokens() -> None:
    """The server's own policy (timed, learned) picks other widths than drafting everything, and
    the answers do not change."""
    model = tiny_model()
    requests = [(p, {"temperature": 0, "max_tokens": m}) for p, m in zip(repetitive_prompts(), [23, 17, 5, 30, 9])]
    learned = HFServerManager(model, _Tok(), autocast_dtype=None, speculative=ON)
    outs = [serve(learned, requests) for _ in range(3)]  # later batches use what the earlier ones taught
    plain = serve(server_for(model, OFF), requests)
    for out in outs:
        assert_same(plain, out)
    assert learned.draft_policy.sums[0] > 0 and learned.draft_policy.accept
