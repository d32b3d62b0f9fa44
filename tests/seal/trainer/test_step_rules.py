"""One rule for both backends: which episodes of a step are trained on, and the advantages the
kept ones get (faults out of the baseline, lone survivors dropped, nothing left -> skipped)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from seal.episode import EpisodeResult
from seal.trainer.step_rules import select_trainable

sys.path.insert(0, str(Path(__file__).parent / "verl"))


def test_faults_and_lone_survivors_are_left_out():
    groups = ["a", "a", "a", "b", "b", "c", "c"]
    excluded = [True, True, False, False, False, True, True]
    sel = select_trainable(excluded, groups, n=3)
    assert sel.trainable == (False, False, False, True, True, False, False)
    assert (sel.excluded, sel.lone_survivors, sel.num_trainable) == (4, 1, 2)
    assert sel.metrics()["seal/skipped_updates"] == 0.0


def test_a_single_rollout_per_task_has_no_lone_survivor():
    sel = select_trainable([False, True], ["a", "b"], n=1)
    assert sel.trainable == (True, False) and sel.lone_survivors == 0


def test_nothing_left_is_a_skipped_update():
    sel = select_trainable([True, False], ["a", "a"], n=2)
    assert sel.nothing_to_train and sel.metrics()["seal/skipped_updates"] == 1.0


def test_a_faulted_record_is_always_excluded():
    assert EpisodeResult("multi_turn_base_1", "multi_turn_base", llm_fault=True).excluded
    assert EpisodeResult("multi_turn_base_1", "multi_turn_base", env_fault=True).excluded
    assert not EpisodeResult("multi_turn_base_1", "multi_turn_base").excluded
    with pytest.raises(ValueError, match="group ids"):
        select_trainable([True], ["a", "b"], n=2)


def test_both_backends_give_the_same_advantages_on_the_same_batch():
    """The verl path (the step rules on verl's DataProto, then verl's ``compute_advantage`` with
    the SEAL estimator) and the local path (GRPO over the kept episodes) agree row for row, lone
    survivor included."""
    pytest.importorskip("verl")
    from verl_testkit import N_ROLLOUTS, make_batch

    from seal.trainer.local.update import Batch, grpo_advantages_verl
    from seal.trainer.verl.batch import select_rows

    faults = {0: "env_fault", 1: "llm_fault", 2: "excluded", 6: "env_fault"}  # row 3: lone survivor
    batch = make_batch(faults)
    _, sel = select_rows(batch, n=N_ROLLOUTS)
    assert sel.lone_survivors == 1 and not sel.trainable[3]
    verl_adv = batch.batch["advantages"]

    keep = torch.tensor(sel.trainable)
    mask = batch.batch["response_mask"][keep].float()
    rewards = batch.batch["token_level_scores"][keep].sum(-1)
    uids = [u for u, k in zip(batch.non_tensor_batch["uid"], sel.trainable) if k]
    local_adv = grpo_advantages_verl(Batch([None] * len(uids), mask, rewards, uids), norm_by_std=True)

    assert torch.equal(verl_adv[keep], local_adv)  # bit-identical, not merely close
    assert not bool(verl_adv[~keep].any()) and not bool(batch.batch["response_mask"][~keep].any())
    assert bool(local_adv.any())  # a non-trivial comparison
