"""GRPO group advantages, computed exactly as verl's ``compute_grpo_outcome_advantage``."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def grpo_advantages(
    rewards: torch.Tensor | Sequence[float],
    index: Sequence[str],
    mask: torch.Tensor,
    *,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """Outcome advantages normalised within each group of episodes sharing a task uid.

    Args:
        rewards: ``(B,)`` one scalar reward per episode (verl sums the token-level rewards,
            which for an outcome reward is this scalar).
        index: ``B`` group ids; the rollouts of one task share an id.
        mask: ``(B, T)`` 1 on assistant (loss) tokens, 0 elsewhere.
        eps: added to the group std before dividing.
        norm_by_std: divide by the group std (GRPO) or only centre (Dr.GRPO).

    Returns:
        ``(B, T)`` advantages: ``(r_i − mean_g) / (std_g + eps)`` broadcast over the row and
        multiplied by the mask. ``std_g`` is the unbiased std (``torch.std``); a group of one
        has mean 0 and std 1, as in verl. The reductions use the same torch ops on the same
        float32 values as verl, so the results are bit-identical.
    """
    if isinstance(rewards, torch.Tensor) and rewards.is_floating_point():
        scores = rewards.detach().clone()
    else:
        scores = torch.as_tensor(rewards, dtype=torch.float32)
    if scores.dim() != 1 or mask.dim() != 2 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"need rewards (B,) and mask (B, T); got {tuple(scores.shape)} and {tuple(mask.shape)}")
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has {len(index)} entries for {scores.shape[0]} rewards")
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(index):
        groups.setdefault(uid, []).append(i)
    out = scores.clone()
    with torch.no_grad():
        for rows in groups.values():
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                group = torch.stack([scores[i] for i in rows])
                mean, std = torch.mean(group), torch.std(group)
            for i in rows:
                out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out.unsqueeze(-1) * mask
