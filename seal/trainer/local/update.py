"""Turning a step's episodes into GRPO advantages and one PPO policy update (verl's core_algos)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from seal.trainer.local.episodes import Episode
from seal.trainer.local.policy import LossSettings, autocast_context, response_logprobs, sequence_loss

logger = logging.getLogger(__name__)


@dataclass
class Batch:
    """The trainable episodes of a step, response-aligned.

    ``mask``: ``(B, T)`` 1 on model-written response tokens (``T`` = longest response);
    ``rewards``: ``(B,)``; ``uids``: the GRPO group of each row.
    """

    episodes: list[Episode]
    mask: torch.Tensor
    rewards: torch.Tensor
    uids: list[str]


def drop_lonely(episodes: Sequence[Episode], n: int) -> list[Episode]:
    """With ``n > 1``, drop episodes whose group lost all other members (faults): verl gives a
    group of one the raw reward as advantage, which is not a baseline-corrected signal."""
    if n <= 1:
        return list(episodes)
    sizes = Counter(e.uid for e in episodes)
    return [e for e in episodes if sizes[e.uid] > 1]


def build_batch(episodes: Sequence[Episode]) -> Batch:
    width = max(len(e.response_ids) for e in episodes)
    mask = torch.zeros(len(episodes), width, dtype=torch.float32)
    for i, e in enumerate(episodes):
        mask[i, : len(e.response_mask)] = torch.tensor(e.response_mask, dtype=torch.float32)
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
    return Batch(list(episodes), mask, rewards, [e.uid for e in episodes])


def grpo_advantages_verl(batch: Batch, *, norm_by_std: bool) -> torch.Tensor:
    """verl's ``compute_grpo_outcome_advantage`` on the batch: ``(B, T)``, zero off the mask.

    The outcome reward sits on the first response token (verl sums the token rewards)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards = torch.zeros_like(batch.mask)
    token_rewards[:, 0] = batch.rewards
    adv, _ = compute_grpo_outcome_advantage(
        token_rewards, batch.mask, np.array(batch.uids, dtype=object), norm_adv_by_std_in_grpo=norm_by_std
    )
    return adv


def _minibatches(n_rows: int, size: int) -> list[list[int]]:
    size = max(1, size)
    return [list(range(i, min(i + size, n_rows))) for i in range(0, n_rows, size)]


@torch.no_grad()
def _logprobs_nograd(model: torch.nn.Module, batch: Batch, device: torch.device, autocast: str
                     ) -> list[torch.Tensor]:
    out = []
    with autocast_context(device, autocast):
        for e in batch.episodes:
            out.append(response_logprobs(model, e.prompt_ids, e.response_ids, device).float().cpu())
    return out


def policy_update(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    advantages: torch.Tensor,
    settings: LossSettings,
    *,
    device: torch.device,
    autocast: str,
    mini_batch_rows: int,
    ppo_epochs: int,
    grad_clip: float,
) -> dict[str, float]:
    """PPO-clip updates on ``batch`` with ``advantages`` ``(B, T)``; returns ``actor/...`` metrics.

    One sequence per micro-batch (no padding; gradients accumulate). With a single update per
    step the old policy *is* the current one, so its log-probs are the detached current ones;
    otherwise they are computed once, before the first update. An update whose gradient norm is
    not finite is skipped, as verl does.
    """
    minibatches = _minibatches(len(batch.episodes), mini_batch_rows)
    single = ppo_epochs * len(minibatches) == 1
    old = None if single else _logprobs_nograd(model, batch, device, autocast)
    ref = _logprobs_nograd(ref_model, batch, device, autocast) if settings.use_kl_loss and ref_model else None
    model.train()
    sums: Counter[str] = Counter()
    count = 0
    for _ in range(ppo_epochs):
        for rows in minibatches:
            ntok = int(batch.mask[rows].sum().item())
            optimizer.zero_grad(set_to_none=True)
            loss_total = 0.0
            for i in rows:
                e = batch.episodes[i]
                r = len(e.response_ids)
                with autocast_context(device, autocast):
                    logp = response_logprobs(model, e.prompt_ids, e.response_ids, device).float()
                old_i = logp.detach() if old is None else old[i].to(device)
                ref_i = ref[i].to(device).unsqueeze(0) if ref is not None else None
                loss, m = sequence_loss(
                    logp.unsqueeze(0), old_i.unsqueeze(0), ref_i, advantages[i : i + 1, :r].to(device),
                    batch.mask[i : i + 1, :r].to(device), settings, batch_num_tokens=max(ntok, 1),
                    global_batch_size=len(rows),
                )
                loss.backward()
                loss_total += float(loss.detach())
                sums.update({k: v for k, v in m.items()})
                count += 1
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
            if math.isfinite(grad_norm):
                optimizer.step()
            else:
                logger.warning("non-finite gradient norm; update skipped")
            optimizer.zero_grad(set_to_none=True)
            sums["actor/grad_norm"] += grad_norm * len(rows)
            sums["actor/loss"] += loss_total * len(rows)
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out["actor/num_updates"] = float(ppo_epochs * len(minibatches))
    out["actor/response_tokens"] = float(batch.mask.sum().item())
    return out
