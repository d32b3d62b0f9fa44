"""Shared-prefix training equals one sequence per row: log-probs, losses, every parameter's
gradient and a whole PPO update, to fp32 rounding; and cutting the prefix's gradient is caught.

The batch is built like a step's: GRPO groups of 4 episodes sharing a prompt, responses of
different lengths with tool observations (mask 0) between model turns; a group whose episodes
also share the start of their first model turn (log-probs read inside the shared prefix), one whose
prompts part before their end (a per-episode hint), two identical episodes, a lone row, and a
group whose episodes go on alike in pairs past the prompt (a prefix tree two levels deep).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from seal.episode import EpisodeResult
from seal.trainer.local import prefix
from seal.trainer.local.episodes import Episode
from seal.trainer.local.policy import LossSettings, frozen_copy, sequence_loss
from seal.trainer.local.update import Batch, RowForwards, build_batch, policy_update

CPU = torch.device("cpu")
VOCAB = 96
# fp32 rounding: the two computations add the same terms in another order (attention split at
# the prefix, gradients summed before or after the prefix's backward).
LOGP_TOL = {"rtol": 1e-5, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-6}


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """2 layers, grouped-query attention (4 query heads, 2 key/value heads), untied head."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def group_episodes(uid: str, prompts: list[list[int]], g: torch.Generator, reward0: float,
                   opening: list[int] = ()) -> list[Episode]:
    """One episode per prompt: a model turn (``opening`` + own tokens), an observation, a model turn."""
    out = []
    for k, prompt in enumerate(prompts):
        turn1, obs, turn2 = (torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (6 + 3 * k, 5, 4 + k))
        response = list(opening) + turn1 + obs + turn2
        mask = [1] * (len(opening) + len(turn1)) + [0] * len(obs) + [1] * len(turn2)
        result = EpisodeResult(task_id=uid, category="multi_turn_base", reward=reward0 + 0.25 * k)
        out.append(Episode(result, uid=uid, sample=k, prompt_ids=prompt, response_ids=response, response_mask=mask))
    return out


def step_batch(seed: int = 3) -> Batch:
    """Groups of 4 with a shared 40-token prompt (one of them also sharing a 5-token opening of its
    first model turn), a group whose prompts part at token 30, two identical episodes, a lone row."""
    g = torch.Generator().manual_seed(seed)
    shared = [torch.randint(3, VOCAB, (40,), generator=g).tolist() for _ in range(3)]
    parting = torch.randint(3, VOCAB, (30,), generator=g).tolist()
    eps = group_episodes("a", [shared[0]] * 4, g, 0.0)
    eps += group_episodes("b", [shared[1]] * 4, g, 0.1, opening=torch.randint(3, VOCAB, (5,), generator=g).tolist())
    eps += group_episodes("c", [parting + torch.randint(3, VOCAB, (6,), generator=g).tolist() for _ in range(4)],
                          g, 0.2)
    twin = group_episodes("e", [shared[2]], g, 0.3)[0]
    eps += [twin, Episode(dataclasses.replace(twin.result, reward=0.9), uid="e", sample=1, prompt_ids=twin.prompt_ids,
                          response_ids=twin.response_ids, response_mask=twin.response_mask)]
    eps += group_episodes("d", [shared[0][:25]], g, 0.5)
    eps += branching_episodes("f", torch.randint(3, VOCAB, (40,), generator=g).tolist(), g)
    return build_batch(eps)


def branching_episodes(uid: str, prompt: list[int], g: torch.Generator) -> list[Episode]:
    """Five episodes of one prompt: 0 and 1 write the same 14-token first turn and get the same
    6-token observation, 2 and 3 another 12 + 6; 4 starts like 0 and 1 but parts after 8 tokens
    (too short a stretch to share with them)."""
    def tokens(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    def other(token: int) -> int:  # a token that differs from ``token``
        return (token - 3 + 1) % (VOCAB - 3) + 3

    turn_a, obs_a, turn_b, obs_b = tokens(14), tokens(6), tokens(12), tokens(6)
    turn_b[0] = other(turn_a[0])  # B parts from A at once
    heads = [(turn_a, obs_a), (turn_a, obs_a), (turn_b, obs_b), (turn_b, obs_b),
             (turn_a[:8] + [other(turn_a[8])] + tokens(5), tokens(6))]
    out = []
    for k, (turn, obs) in enumerate(heads):
        own_turn, own_obs, last = [3 + k] + tokens(2 + k), tokens(4), tokens(2 + k)  # own turns part at once
        # The first turn, its observation, then a turn of the row's own, an observation and a last turn.
        response = turn + obs + own_turn + own_obs + last
        mask = [1] * len(turn) + [0] * len(obs) + [1] * len(own_turn) + [0] * len(own_obs) + [1] * len(last)
        result = EpisodeResult(task_id=uid, category="multi_turn_base", reward=0.1 * k)
        out.append(Episode(result, uid=uid, sample=k, prompt_ids=prompt, response_ids=response, response_mask=mask))
    return out


def settings() -> LossSettings:
    return LossSettings(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                        loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=0.01, kl_loss_type="low_var_kl")


def advantages(batch: Batch) -> torch.Tensor:
    values = torch.linspace(-1.0, 1.0, len(batch.episodes))
    return values[:, None] * batch.mask


def gradients(model: torch.nn.Module, batch: Batch, *, shared_prefix: bool, ref: dict[int, torch.Tensor]
              ) -> tuple[float, dict[str, torch.Tensor]]:
    """The mini-batch loss (whole batch, verl's token-mean) and every parameter's gradient."""
    forwards = RowForwards(batch, shared_prefix=shared_prefix, device=CPU, autocast="none")
    adv, loss_total = advantages(batch), []
    ntok = int(batch.mask.sum())

    def row_loss(i: int, logp: torch.Tensor) -> torch.Tensor:
        # An old policy a little off the current one, so the clip and the ratio both act.
        old = (logp.detach() + 0.1 * torch.sin(torch.arange(logp.shape[0], dtype=torch.float32)))[None]
        r = logp.shape[0]
        loss, _ = sequence_loss(logp[None], old, ref[i][None], adv[i : i + 1, :r], batch.mask[i : i + 1, :r],
                                settings(), batch_num_tokens=ntok, global_batch_size=len(batch.episodes))
        loss_total.append(float(loss.detach()))
        return loss

    model.zero_grad(set_to_none=True)
    forwards.backward(model, range(len(batch.episodes)), row_loss)
    return sum(loss_total), {n: p.grad.clone() for n, p in model.named_parameters()}


def read_positions(batch: Batch, i: int) -> torch.Tensor:
    return batch.mask[i, : len(batch.episodes[i].response_ids)] > 0


def tree(node: prefix.Node) -> tuple:
    """A node as (rows, start, end, children...); a leaf as (row, start)."""
    if node.is_leaf:
        return node.rows[0], node.start
    return (node.rows, node.start, node.end, *map(tree, node.children))


def test_groups_share_their_common_beginnings_as_a_tree():
    batch = step_batch()
    forwards = RowForwards(batch, shared_prefix=True, device=CPU, autocast="none")
    groups = forwards.groups(tiny_llama(), range(len(batch.episodes)))
    twin = batch.episodes[12]
    twin_shared = len(twin.prompt_ids) + len(twin.response_ids) - 1
    # a: the prompt; b: the prompt and the shared opening; c: up to where the prompts part; e: all
    # but the last token of the identical pair; d: alone; f: the prompt, then two pairs that go on
    # alike (20 and 18 tokens), and a row that agrees with the first pair for only 8 tokens.
    assert [tree(node) for node in groups] == [
        ([0, 1, 2, 3], 0, 40, (0, 40), (1, 40), (2, 40), (3, 40)),
        ([4, 5, 6, 7], 0, 45, (4, 45), (5, 45), (6, 45), (7, 45)),
        ([8, 9, 10, 11], 0, 30, (8, 30), (9, 30), (10, 30), (11, 30)),
        ([12, 13], 0, twin_shared, (12, twin_shared), (13, twin_shared)),
        (14, 0),
        ([15, 16, 17, 18, 19], 0, 40, ([15, 16], 40, 60, (15, 60), (16, 60)), (19, 40),
         ([17, 18], 40, 58, (17, 58), (18, 58)))]
    rows = forwards.rows
    computed = sum(node.tokens_computed() for node in groups)
    assert computed == sum(len(r.ids) for r in rows) - 3 * 40 - 3 * 45 - 3 * 30 - twin_shared - 4 * 40 - 20 - 18


def test_a_short_common_stretch_is_not_shared_and_no_sharing_means_one_sequence_per_row():
    batch = step_batch()
    rows = RowForwards(batch, shared_prefix=True, device=CPU, autocast="none").rows
    # Rows 15 and 19 agree on 48 tokens, 15 and 16 on 60. From position 40 with a minimum of 21,
    # the pair's 20 further tokens are too few: every row is a leaf. From 0 with 60, they are a node.
    assert [tree(n) for n in prefix.split_rows(rows, [15, 19, 16], 40, 21)] == [(15, 40), (16, 40), (19, 40)]
    assert [tree(n) for n in prefix.split_rows(rows, [15, 19, 16], 0, 60)] == [([15, 16], 0, 60, (15, 60), (16, 60)),
                                                                                (19, 0)]
    assert [tree(n) for n in prefix.plan_groups(rows, batch.uids, range(15, 20), 0)] == [(i, 0) for i in range(15, 20)]


def test_logprobs_equal_per_row_sequences():
    model, batch = tiny_llama(), step_batch()
    rows = range(len(batch.episodes))
    per_row = RowForwards(batch, shared_prefix=False, device=CPU, autocast="none").logprobs(model, rows)
    shared = RowForwards(batch, shared_prefix=True, device=CPU, autocast="none").logprobs(model, rows)
    for i in rows:
        read = read_positions(batch, i)
        torch.testing.assert_close(shared[i][read], per_row[i][read], **LOGP_TOL)
        assert torch.all(shared[i][~read] == 0)  # no logits where nothing is read


def test_loss_and_every_gradient_equal_per_row_sequences():
    model, batch = tiny_llama(), step_batch()
    ref = RowForwards(batch, shared_prefix=False, device=CPU, autocast="none").logprobs(tiny_llama(seed=5),
                                                                                        range(len(batch.episodes)))
    loss_rows, grads_rows = gradients(model, batch, shared_prefix=False, ref=ref)
    loss_shared, grads_shared = gradients(model, batch, shared_prefix=True, ref=ref)
    assert loss_shared == pytest.approx(loss_rows, rel=1e-5)
    assert grads_shared.keys() == grads_rows.keys() == {n for n, _ in model.named_parameters()}
    for name in grads_rows:
        assert grads_rows[name].abs().sum() > 0, name  # every parameter gets a gradient to compare
        torch.testing.assert_close(grads_shared[name], grads_rows[name], **GRAD_TOL, msg=name)


def test_cut_prefix_gradient_fails_the_comparison(monkeypatch):
    """With the backward through the shared prompt dropped (its key/values effectively detached),
    the gradients differ beyond the tolerance: the equality above can fail."""
    model, batch = tiny_llama(), step_batch()
    ref = RowForwards(batch, shared_prefix=False, device=CPU, autocast="none").logprobs(tiny_llama(seed=5),
                                                                                        range(len(batch.episodes)))
    _, grads_rows = gradients(model, batch, shared_prefix=False, ref=ref)
    monkeypatch.setattr(prefix, "backward_through_prefix", lambda *_: None)  # the prefix's key/values detached
    _, grads_cut = gradients(model, batch, shared_prefix=True, ref=ref)
    differing = []
    for name in grads_rows:
        try:
            torch.testing.assert_close(grads_cut[name], grads_rows[name], **GRAD_TOL)
        except AssertionError:
            differing.append(name)
    # Every weight the prompt positions pass through: embeddings, and each layer's projections.
    assert "model.embed_tokens.weight" in differing
    assert "model.layers.0.self_attn.k_proj.weight" in differing
    assert len(differing) >= len(grads_rows) // 2


def test_cut_gradient_of_an_inner_node_fails_the_comparison(monkeypatch):
    """The same with only the nodes below a prompt cut (group f's two pairs): their tokens' share of
    the gradient, which reaches the weights and the prompt's key/values only through their own
    backward, is missing."""
    model, batch = tiny_llama(), step_batch()
    ref = RowForwards(batch, shared_prefix=False, device=CPU, autocast="none").logprobs(tiny_llama(seed=5),
                                                                                        range(len(batch.episodes)))
    _, grads_rows = gradients(model, batch, shared_prefix=False, ref=ref)
    whole = prefix.backward_through_prefix
    inner = []

    def root_only(shared: prefix.SharedPrefix, leaves: prefix.SharedPrefix) -> None:
        if shared.start > 0:
            inner.append((shared.start, shared.end))
            return
        whole(shared, leaves)

    monkeypatch.setattr(prefix, "backward_through_prefix", root_only)
    _, grads_cut = gradients(model, batch, shared_prefix=True, ref=ref)
    assert sorted(inner) == [(40, 58), (40, 60)]
    differing = [name for name in grads_rows
                 if not torch.allclose(grads_cut[name], grads_rows[name], rtol=GRAD_TOL["rtol"], atol=GRAD_TOL["atol"])]
    assert "model.layers.0.self_attn.k_proj.weight" in differing and len(differing) >= len(grads_rows) // 2


def test_policy_update_equals_per_row_update():
    """A whole update (3 mini-batches, 2 PPO epochs: old log-probs, reference, optimizer steps)."""
    batch = step_batch()
    results = {}
    for shared in (False, True):
        model = tiny_llama()
        ref_model = frozen_copy(tiny_llama(seed=5))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        metrics = policy_update(model, ref_model, optimizer, batch, advantages(batch), settings(), device=CPU,
                                autocast="none", mini_batch_rows=8, ppo_epochs=2, grad_clip=1.0,
                                shared_prefix=shared)
        results[shared] = (copy.deepcopy(model.state_dict()), metrics)
    (w_rows, m_rows), (w_shared, m_shared) = results[False], results[True]
    for key in ("actor/loss", "actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/ppo_kl"):
        assert m_shared[key] == pytest.approx(m_rows[key], rel=1e-4, abs=1e-7), key
    # AdamW divides each gradient by its running scale, so an element whose gradient is near 0
    # turns a rounding difference into a step of up to lr's size: 1e-5 here (one element of 2,048
    # in two matrices, 5.7e-6), against steps of up to 6e-3; a wrong gradient moves weights by ~1e-3.
    for name, w in w_rows.items():
        torch.testing.assert_close(w_shared[name], w, rtol=1e-5, atol=1e-5, msg=name)
    assert m_shared["actor/num_updates"] == 3 * 2  # 20 rows: mini-batches of 8, 8 and 4; 2 epochs


def test_gradient_checkpointing_falls_back_to_per_row_sequences():
    model, batch = tiny_llama(), step_batch()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    forwards = RowForwards(batch, shared_prefix=True, device=CPU, autocast="none")
    assert forwards.groups(model, range(len(batch.episodes))) is None
    model.eval()  # checkpointing acts in training mode only: the no-grad passes keep the prefix
    assert forwards.groups(model, range(len(batch.episodes))) is not None
