"""One pass over each verl step: the step rules applied once, in verl's ``_balance_batch`` (after
it pads the batch, never counting its padding rows), and the GRPO advantages computed once, by the
SEAL estimator that verl's own ``_compute_advantage`` finds under the configured
``algorithm.adv_estimator``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from verl_testkit import EPISODES, make_step, make_trainer, padded, read_rows, run_step, run_to_advantages

from seal.config import REPO_ROOT, compose_config

pytest.importorskip("verl")

from verl.trainer.ppo import core_algos  # noqa: E402

from seal.advantage.grpo import SEAL_GRPO, compute_seal_grpo_advantage, grpo_advantages  # noqa: E402
from seal.trainer.verl.trainer import use_seal_grpo  # noqa: E402

FAULTS = {1: "env_fault", 6: "llm_fault"}


def test_the_recipes_grpo_runs_as_the_seal_estimator(seal_cfg, tmp_path, caplog):
    assert seal_cfg.algorithm.adv_estimator == "grpo"  # the paper's value stays in the config
    with caplog.at_level("INFO"):
        trainer = make_trainer(seal_cfg, tmp_path)
    assert trainer.config.algorithm.adv_estimator == SEAL_GRPO
    assert any("adv_estimator=grpo runs as seal_grpo" in r.getMessage() for r in caplog.records)
    other = compose_config("exp/SEAL.yaml", ["algorithm.adv_estimator=rloo"])
    use_seal_grpo(other)
    assert other.algorithm.adv_estimator == "rloo"  # another estimator is the user's choice


def _advantages(trainer, batch):
    """verl's V1 step up to its advantages (:func:`verl_testkit.run_to_advantages`); the
    advantages it wrote to TransferQueue, in ``batch``'s key order."""
    run_to_advantages(trainer, batch)
    return padded(read_rows(batch.keys, "advantages")["advantages"])


@pytest.mark.usefixtures("transfer_queue")
def test_verls_compute_advantage_calls_the_configured_seal_estimator(seal_cfg, tmp_path, monkeypatch):
    batch = make_step(FAULTS)  # the agent loop zeroed the faulted rows' masks
    calls = []

    def spy(**kwargs):
        calls.append(sorted(kwargs))
        return compute_seal_grpo_advantage(**kwargs)

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, SEAL_GRPO, spy)
    seen = _advantages(make_trainer(seal_cfg, tmp_path), batch)

    assert calls == [["config", "index", "response_mask", "token_level_rewards"]]
    rows = read_rows(batch.keys, "rm_scores", "response_mask", "uid")
    expected = grpo_advantages(padded(rows["rm_scores"]), padded(rows["response_mask"]), rows["uid"])
    assert torch.equal(seen, expected) and expected.any()
    plain = make_trainer(seal_cfg, tmp_path / "plain")
    plain.config.algorithm.adv_estimator = "grpo"  # verl's own GRPO, as if use_seal_grpo had not run
    other = make_step(FAULTS)
    assert not torch.equal(_advantages(plain, other), expected)  # verl's inline GRPO keeps the faults in


@pytest.mark.usefixtures("transfer_queue")
def test_an_excluded_rows_reward_does_not_move_its_groups_baseline(seal_cfg, tmp_path):
    trained = []
    for reward in (0.0, 1.0):
        batch = make_step(FAULTS, rewards={1: reward})
        trainer = make_trainer(seal_cfg, tmp_path / str(reward), step=2)
        run_step(trainer, batch)
        trained.append(trainer.actor_rollout_wg.updates[-1].padded("advantages", batch.keys))
    assert torch.equal(trained[0], trained[1])
    assert trained[0][0].any() and not trained[0][1].any()


@pytest.mark.usefixtures("transfer_queue")
def test_padding_rows_verl_adds_are_never_counted(seal_cfg, tmp_path):
    """Three data-parallel ranks: verl's ``_balance_batch`` pads the 8 episodes to its batch
    multiple with copies of the first episode's fields (its SEAL record included). The step rules,
    the capability state and the metrics see the real episodes only; no padding row is trained on."""
    batch = make_step()
    trainer = make_trainer(seal_cfg, tmp_path, step=2, dp=3)
    balanced, metrics = run_step(trainer, batch)

    padding = [k for k, tag in zip(balanced.keys, balanced.tags) if tag.get("is_padding")]
    assert len(balanced) % 3 == 0 and len(padding) == len(balanced) - len(EPISODES) > 0
    first = read_rows([batch.keys[0], padding[0]], "extra_fields")["extra_fields"]
    assert first[0]["task_id"] == first[1]["task_id"]  # a padding row carries a real record
    assert metrics["seal/episodes"] == len(EPISODES) == metrics["seal/observed_episodes"]
    assert metrics["seal/trained_episodes"] == len(EPISODES) and metrics["seal/lone_survivors"] == 0
    assert trainer.coevolution.state.observe_count == len(EPISODES)
    (update,) = trainer.actor_rollout_wg.updates
    assert sorted(update.keys) == sorted(balanced.keys)
    for key in padding:
        assert not update.rows["advantages"][key].any() and not update.rows["loss_mask"][key].any()
    assert all(update.rows["advantages"][k].any() for k in batch.keys)


def test_the_trainer_module_registers_the_estimator_on_import():
    """The Ray task runner imports the trainer module to build the trainer, then runs
    ``_compute_advantage`` in the same process: that import alone registers ``seal_grpo``."""
    code = ("import seal.trainer.verl.trainer\n"
            "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "print(get_adv_estimator_fn('seal_grpo').__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "seal.advantage.grpo"
