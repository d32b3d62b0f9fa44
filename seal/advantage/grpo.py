"""GRPO group advantages that keep the rows left out of training out of the group baselines.

Both trainers call :func:`grpo_advantages`; verl's ``compute_advantage`` runs it as the
estimator ``seal_grpo`` (registered here with verl's ``register_adv_est``).

A row is left out when it has no response token (an all-zero ``response_mask`` row): verl hands an
estimator rewards, masks and group ids, not the batch. The SEAL trainers zero the masks of the
episodes the step rules leave out (:mod:`seal.trainer.step_rules`) before the advantages, and an
episode whose model wrote nothing is excluded by the runner, so with verl's defaults the two rules
are the same. verl's rollout-correction rejection (``algorithm.rollout_correction.rollout_rs``,
off by default) widens it: a row whose every token it rejects also leaves its group's baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

SEAL_GRPO = "seal_grpo"


def grpo_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, *,
                    norm_by_std: bool = True, epsilon: float = 1e-6) -> torch.Tensor:
    """verl's ``compute_grpo_outcome_advantage`` over the rows that have a response token.

    Args:
        token_level_rewards: ``(B, T)``; a row's outcome reward is its sum.
        response_mask: ``(B, T)``; an all-zero row is left out (see the module docstring).
        index: ``B`` GRPO group ids (verl's ``uid``).
        norm_by_std: divide by the group's std (``algorithm.norm_adv_by_std_in_grpo``).

    Returns:
        ``(B, T)`` advantages, zero off the mask and on the rows left out. With no row left out
        they are verl's GRPO advantages bit for bit.
    """
    kept = response_mask.any(dim=-1)
    kept_adv, _ = compute_grpo_outcome_advantage(
        token_level_rewards[kept], response_mask[kept], np.asarray(index, dtype=object)[kept.cpu().numpy()],
        epsilon=epsilon, norm_adv_by_std_in_grpo=norm_by_std)
    adv = kept_adv.new_zeros(response_mask.shape)
    adv[kept] = kept_adv
    return adv


@register_adv_est(SEAL_GRPO)
def compute_seal_grpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                                config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator interface to :func:`grpo_advantages`: ``(advantages, returns)``, equal as
    in verl's GRPO; ``config`` is ``algorithm`` (its ``norm_adv_by_std_in_grpo``, default true)."""
    norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    adv = grpo_advantages(token_level_rewards, response_mask, index, norm_by_std=norm)
    return adv, adv
