"""One local policy update moves each response's log-probability with its advantage's sign.

The batch is one GRPO group of two multi-turn responses (model turn, tool observation, model
turn; the observation has mask 0) with advantage +1 on one and -1 on the other. The advantage is
set on *every* response token, observations included, so the loss mask alone keeps the
observations out of training. ``policy_update`` runs as the local trainer calls it (the
quickstart's loss settings: PPO clip, token-mean, low_var_kl to a frozen reference, AdamW, grad
clip), with a learning rate large enough that one step is far above float noise.

The same test with the loss fed a flipped advantage sign or an inverted mask must fail the
direction check (:mod:`update_direction`); the sabotaged cases assert that it does.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from update_direction import SABOTAGES, describe, direction_held, row_changes, sabotaged

from seal.episode import EpisodeResult
from seal.trainer.local import update
from seal.trainer.local.episodes import Episode
from seal.trainer.local.policy import LossSettings, frozen_copy, response_logprobs
from seal.trainer.local.update import Batch, build_batch, policy_update

CPU = torch.device("cpu")
VOCAB = 128
LR = 1e-2


def tiny_policy(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)


def multi_turn_group(seed: int = 1) -> list[Episode]:
    """Two episodes of one task (same prompt, one GRPO group): 6 model tokens, a 5-token tool
    observation (mask 0), 4 model tokens. Rewards 1 and 0, matching the advantages' signs."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (10,), generator=g).tolist()
    episodes = []
    for sample, reward in enumerate([1.0, 0.0]):
        turn1, observation, turn2 = (torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (6, 5, 4))
        result = EpisodeResult(task_id="multi_turn_base_1", category="multi_turn_base", reward=reward)
        episodes.append(Episode(result, uid="g0", sample=sample, prompt_ids=prompt,
                                response_ids=turn1 + observation + turn2, response_mask=[1] * 6 + [0] * 5 + [1] * 4))
    return episodes


def response_logprobs_of(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """``(B, T)`` log-probs of every response token (the responses have equal lengths)."""
    with torch.no_grad():
        return torch.stack([response_logprobs(model, e.prompt_ids, e.response_ids, CPU) for e in batch.episodes])


@pytest.mark.parametrize("sabotage", SABOTAGES)
def test_one_local_update_follows_the_advantage_sign(sabotage: str | None, trainer_config,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """+1 raises the model-written tokens' log-probs, -1 lowers them, the observations move
    less; with the loss's advantage sign or mask flipped (``sabotage``) that no longer holds."""
    actor = trainer_config("direction", [f"actor_rollout_ref.actor.optim.lr={LR}"]).actor_rollout_ref.actor
    settings = LossSettings.from_cfg(actor)
    assert settings.use_kl_loss and settings.kl_loss_type == "low_var_kl"  # the recipe's KL term is in the loss
    model = tiny_policy()
    ref = frozen_copy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(actor.optim.lr),
                                  betas=tuple(float(b) for b in actor.optim.betas),
                                  weight_decay=float(actor.optim.weight_decay))
    batch = build_batch(multi_turn_group())
    assert (batch.mask.sum(dim=1) < batch.mask.shape[1]).all()  # every row has untrained tokens
    advantages = torch.tensor([[1.0], [-1.0]]).expand_as(batch.mask).clone()

    loss = update.sequence_loss

    def sabotaged_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                       adv: torch.Tensor, mask: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        adv, mask = sabotaged(adv, mask, sabotage)
        return loss(logp, old_logp, ref_logp, adv, mask, *args, **kwargs)

    monkeypatch.setattr(update, "sequence_loss", sabotaged_loss)

    before = response_logprobs_of(model, batch)
    metrics = policy_update(model, ref, optimizer, batch, advantages, settings, device=CPU, autocast="none",
                            mini_batch_rows=len(batch.episodes), ppo_epochs=1,
                            grad_clip=float(actor.optim.clip_grad))
    after = response_logprobs_of(model, batch)

    assert metrics["actor/skipped_updates"] == 0.0 and "actor/kl_loss" in metrics
    changes = row_changes(before, after, batch.mask, [1.0, -1.0])
    assert direction_held(changes) is (sabotage is None), describe(changes)
