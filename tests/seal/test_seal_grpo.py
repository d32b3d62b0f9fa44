"""GRPO group advantages as the trainers compute them (:mod:`seal.advantage.grpo`, verl's
compute_grpo_outcome_advantage over the rows that have a response token).

The local backend calls the estimator through ``grpo_advantages_verl``; these tests pin the
numbers it produces against the formula written out by hand, against verl's own GRPO, and the
rows it leaves out of the baselines."""

import numpy as np
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


def _random_groups(seed: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(seed)
    uids = [f"uid{i % 4}" for i in torch.randperm(16, generator=g).tolist()] + ["singleton"]
    rewards = torch.zeros(len(uids), 5)
    rewards[:, -1] = torch.rand(len(uids), generator=g)
    mask = (torch.rand(len(uids), 5, generator=g) > 0.3).long()
    mask[:, 0] = 1
    return rewards, mask, uids


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm", [True, False])
def test_with_no_row_left_out_it_is_verls_grpo_bit_for_bit(seed: int, norm: bool) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from seal.advantage.grpo import grpo_advantages

    rewards, mask, uids = _random_groups(seed)
    expected, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(uids, dtype=object),
                                                 norm_adv_by_std_in_grpo=norm)
    assert torch.equal(grpo_advantages(rewards, mask, uids, norm_by_std=norm), expected)


def test_a_row_without_response_tokens_leaves_its_group_baseline() -> None:
    """Its reward moves no other row's advantage (verl's GRPO would move them), and its own
    advantage is 0; the other rows get verl's GRPO over the group without it."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from seal.advantage.grpo import grpo_advantages

    rewards, mask, uids = _random_groups(0)
    out = 2
    mask[out] = 0
    results, plain = [], []
    for reward in (0.0, 1.0):
        rewards[out, -1] = reward
        results.append(grpo_advantages(rewards, mask, uids))
        plain.append(compute_grpo_outcome_advantage(rewards, mask, np.array(uids, dtype=object))[0])
        assert not results[-1][out].any()
    assert torch.equal(results[0], results[1])
    assert not torch.equal(plain[0], plain[1])  # a case where verl's GRPO baseline moves
    keep = torch.ones(len(uids), dtype=torch.bool)
    keep[out] = False
    kept, _ = compute_grpo_outcome_advantage(rewards[keep], mask[keep], np.array(uids, dtype=object)[keep.numpy()])
    assert torch.equal(results[1][keep], kept)


def test_every_row_left_out_gives_zero_advantages() -> None:
    from seal.advantage.grpo import grpo_advantages

    adv = grpo_advantages(torch.ones(3, 4), torch.zeros(3, 4, dtype=torch.long), ["a", "a", "b"])
    assert adv.shape == (3, 4) and not adv.any()
