"""One pass over each verl step: the step rules applied once, by the first SEAL hook, and the GRPO
advantages computed once, by the SEAL estimator that verl's own ``compute_advantage`` finds under
the configured ``algorithm.adv_estimator``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from verl_testkit import N_ROLLOUTS, make_batch, make_trainer

from seal.config import REPO_ROOT, ConfigError, compose_config

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage  # noqa: E402

from seal.advantage.grpo import SEAL_GRPO, compute_seal_grpo_advantage, grpo_advantages  # noqa: E402
from seal.trainer.verl.trainer import check_verl_config, use_seal_grpo  # noqa: E402

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


def test_verls_compute_advantage_calls_the_configured_seal_estimator(seal_cfg, tmp_path, monkeypatch):
    batch, plain = make_batch(FAULTS), make_batch(FAULTS)  # the step rules zeroed the faulted rows' masks
    calls = []

    def spy(**kwargs):
        calls.append(sorted(kwargs))
        return compute_seal_grpo_advantage(**kwargs)

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, SEAL_GRPO, spy)
    algorithm = make_trainer(seal_cfg, tmp_path).config.algorithm
    out = compute_advantage(batch, adv_estimator=algorithm.adv_estimator, num_repeat=N_ROLLOUTS, config=algorithm)

    assert calls == [["config", "index", "response_mask", "token_level_rewards"]]
    expected = grpo_advantages(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                               batch.non_tensor_batch["uid"])
    assert torch.equal(out.batch["advantages"], expected)
    plain = compute_advantage(plain, adv_estimator="grpo", num_repeat=N_ROLLOUTS)
    assert not torch.equal(plain.batch["advantages"], expected)  # verl's inline GRPO keeps the faults in


def test_an_excluded_rows_reward_does_not_move_its_groups_baseline(seal_cfg, tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(RayPPOTrainer, "_update_actor", lambda self, batch: trained.append(
        batch.batch["advantages"].clone()) or DataProto.from_single_dict(data={}, meta_info={"metrics": {}}))
    for reward in (0.0, 1.0):
        batch = make_batch(FAULTS, rewards={1: reward})
        make_trainer(seal_cfg, tmp_path / str(reward), step=2)._update_actor(batch)
    assert torch.equal(trained[0], trained[1])
    assert trained[0][0].any() and not trained[0][1].any()


def test_the_trainer_module_registers_the_estimator_on_import():
    """The Ray task runner imports the trainer module to build the trainer, then runs
    ``compute_advantage`` in the same process: that import alone registers ``seal_grpo``."""
    code = ("import seal.trainer.verl.trainer\n"
            "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "print(get_adv_estimator_fn('seal_grpo').__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "seal.advantage.grpo"


def test_bypass_mode_without_a_reference_policy_is_refused():
    overrides = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.actor.use_kl_loss=false"]
    fix = "bypass_mode=false or actor_rollout_ref.actor.use_kl_loss=true"
    with pytest.raises(ConfigError, match=fix):
        compose_config("exp/SEAL.yaml", overrides)  # the config pass
    with pytest.raises(ConfigError, match=fix):  # and again where the trainer starts
        check_verl_config(compose_config("exp/SEAL.yaml", overrides, check=False))
    check_verl_config(compose_config("exp/SEAL.yaml", ["algorithm.rollout_correction.bypass_mode=true"]))
