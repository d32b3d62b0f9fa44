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


@pytest.fixture(scope="module")
def transfer_queue():
    """The TransferQueue verl's V1 trainer keeps each step's batch in (a small local Ray)."""
    pytest.importorskip("verl")
    from verl_testkit import transfer_queue_running

    with transfer_queue_running():
        yield


def test_both_backends_give_the_same_advantages_on_the_same_batch(tmp_path, transfer_queue):
    """The verl path (verl's V1 step: the step rules in its batch balancing, then its
    ``_compute_advantage`` with the SEAL estimator, over TransferQueue) and the local path (GRPO
    over the kept episodes) agree row for row, lone survivor included."""
    from verl_testkit import make_step, make_trainer, padded, read_rows, run_to_advantages

    from seal.config import compose_config
    from seal.trainer.local.update import Batch, grpo_advantages_verl

    faults = {0: "env_fault", 1: "llm_fault", 2: "excluded", 6: "env_fault"}  # row 3: lone survivor
    batch = make_step(faults)
    put = read_rows(batch.keys, "rm_scores", "response_mask", "uid")  # as the agent loop put them
    trainer = make_trainer(compose_config("exp/SEAL.yaml"), tmp_path)
    run_to_advantages(trainer, batch)
    sel = trainer._step.aligned_to(batch.keys).selection
    assert sel.lone_survivors == 1 and not sel.trainable[3] and bool(put["response_mask"][3].any())
    after = read_rows(batch.keys, "advantages", "response_mask")
    verl_adv = padded(after["advantages"])

    keep = torch.tensor(sel.trainable)
    mask = padded(put["response_mask"])[keep].float()
    rewards = padded(put["rm_scores"])[keep].sum(-1)
    uids = [u for u, k in zip(put["uid"], sel.trainable) if k]
    local_adv = grpo_advantages_verl(Batch([None] * len(uids), mask, rewards, uids), norm_by_std=True)

    assert torch.equal(verl_adv[keep], local_adv)  # bit-identical, not merely close
    assert not bool(verl_adv[~keep].any()) and not bool(padded(after["response_mask"])[~keep].any())
    assert bool(local_adv.any())  # a non-trivial comparison
