"""GRPO group advantages as the trainers compute them (verl's compute_grpo_outcome_advantage).

The local backend calls verl's function through ``grpo_advantages_verl``; these tests pin the
numbers it produces against the formula written out by hand."""

import pytest
import torch

from seal.trainer.local.update import Batch, grpo_advantages_verl


def _grpo(rewards: torch.Tensor, mask: torch.Tensor, uids: list[str], *, norm: bool = True) -> torch.Tensor:
    return grpo_advantages_verl(Batch([None] * len(uids), mask, rewards, uids), norm_by_std=norm)


def _by_hand(rewards: list[float], uids: list[str], norm: bool) -> list[float]:
    out = []
    for r, uid in zip(rewards, uids):
        group = [x for x, u in zip(rewards, uids) if u == uid]
        if len(group) == 1:  # verl: a group of one has mean 0 and std 1
            mean, std = 0.0, 1.0
        else:
            mean = sum(group) / len(group)
            std = (sum((x - mean) ** 2 for x in group) / (len(group) - 1)) ** 0.5
        out.append((r - mean) / (std + 1e-6) if norm else r - mean)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("norm", [True, False])
def test_matches_the_formula_on_random_groups(seed: int, norm: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    uids = [f"uid{i % 5}" for i in torch.randperm(20, generator=g).tolist()] + ["singleton"]
    rewards = torch.randint(0, 2, (len(uids),), generator=g).float() if seed % 2 else torch.rand(len(uids), generator=g)
    mask = (torch.rand(len(uids), 7, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    adv = _grpo(rewards, mask, uids, norm=norm)
    expected = torch.tensor(_by_hand(rewards.tolist(), uids, norm)).unsqueeze(-1) * mask
    assert torch.allclose(adv, expected, atol=1e-5)


def test_hand_computed_group() -> None:
    adv = _grpo(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0]), torch.ones(5, 2), ["a", "a", "a", "a", "b"])
    std = float(torch.tensor([1.0, 0, 0, 0]).std())  # unbiased: 0.5
    assert adv[0, 0].item() == pytest.approx((1 - 0.25) / (std + 1e-6), abs=1e-6)
    assert adv[1, 1].item() == pytest.approx((0 - 0.25) / (std + 1e-6), abs=1e-6)
    assert adv[4, 0].item() == pytest.approx(1.0 / (1.0 + 1e-6), abs=1e-6)  # singleton: (r - 0) / (1 + eps)


def test_mask_zeroes_non_assistant_tokens_and_inputs_are_untouched() -> None:
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    before = rewards.clone()
    adv = _grpo(rewards, mask, ["g", "g"])
    assert adv[0, 1] == 0 and adv[1, 0] == 0
    assert adv[0, 0] > 0 > adv[1, 1]
    assert torch.equal(rewards, before)
