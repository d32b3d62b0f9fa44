"""GRPO group advantages equal verl's compute_grpo_outcome_advantage."""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from seal.advantage import grpo_advantages


def _verl(rewards: torch.Tensor, index: list[str], mask: torch.Tensor, norm: bool) -> torch.Tensor:
    # verl reads the outcome from the token-level rewards; put it on the last valid token.
    token_rewards = torch.zeros_like(mask, dtype=torch.float32)
    for i in range(len(rewards)):
        last = int(mask[i].nonzero().max()) if mask[i].any() else 0
        token_rewards[i, last] = rewards[i]
    adv, ret = compute_grpo_outcome_advantage(
        token_rewards, mask, np.array(index, dtype=object), epsilon=1e-6, norm_adv_by_std_in_grpo=norm
    )
    assert torch.equal(adv, ret)
    return adv


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm", [True, False])
def test_matches_verl_exactly(seed: int, norm: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    n_groups, n = 5, 4
    index = [f"uid{i % n_groups}" for i in torch.randperm(n_groups * n, generator=g).tolist()]
    index.append("singleton")  # a group of one: mean 0, std 1
    B, T = len(index), 7
    if seed % 2:
        rewards = torch.randint(0, 2, (B,), generator=g).float()  # binary, with all-equal groups likely
    else:
        rewards = torch.rand(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    ours = grpo_advantages(rewards, index, mask, eps=1e-6, norm_by_std=norm)
    assert torch.equal(ours, _verl(rewards, index, mask, norm))


def test_hand_computed_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    mask = torch.ones(5, 2)
    adv = grpo_advantages(rewards, ["a", "a", "a", "a", "b"], mask)
    std = float(torch.tensor([1.0, 0, 0, 0]).std())  # unbiased: 0.5
    assert adv[0, 0].item() == pytest.approx((1 - 0.25) / (std + 1e-6), abs=1e-6)
    assert adv[1, 1].item() == pytest.approx((0 - 0.25) / (std + 1e-6), abs=1e-6)
    assert adv[4, 0].item() == pytest.approx(1.0 / (1.0 + 1e-6), abs=1e-6)  # singleton: (r - 0) / (1 + eps)


def test_mask_zeroes_non_assistant_tokens_and_inputs_are_untouched() -> None:
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    before = rewards.clone()
    adv = grpo_advantages(rewards, ["g", "g"], mask)
    assert adv[0, 1] == 0 and adv[1, 0] == 0
    assert adv[0, 0] > 0 > adv[1, 1]
    assert torch.equal(rewards, before)


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="index has 1 entries"):
        grpo_advantages(torch.zeros(2), ["a"], torch.ones(2, 3))
    with pytest.raises(ValueError, match="need rewards"):
        grpo_advantages(torch.zeros(2), ["a", "b"], torch.ones(3, 3))
