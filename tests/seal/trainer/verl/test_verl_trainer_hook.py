"""The SEAL step inside verl's ``_update_actor``: same advantages as the shared A-Patch code,
faults kept out of the update, metrics passed to verl's logging, state saved with checkpoints."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from verl_testkit import EPISODES, N_ROLLOUTS, make_batch, make_trainer

from seal.trainer.coevolution import CoEvolution
from seal.trainer.verl.batch import TRAINABLE_COLUMN, episode_results

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402

from seal.config import ConfigError  # noqa: E402
from seal.trainer.verl.trainer import SEAL_CKPT_DIR  # noqa: E402


@pytest.fixture
def fake_actor_update(monkeypatch):
    """Replace verl's actor update (a Ray call into FSDP workers) and record what it was given."""
    seen = {}

    def update(self, batch):
        seen["advantages"] = batch.batch["advantages"].clone()
        seen["response_mask"] = batch.batch["response_mask"].clone()
        return DataProto.from_single_dict(data={}, meta_info={"metrics": {"actor/pg_loss": 0.25}})

    monkeypatch.setattr(RayPPOTrainer, "_update_actor", update)
    return seen


def _reference(cfg, tmp_path, batch, step):
    """What the shared hooks compute for the same episodes: observe, then reweight."""
    hooks = CoEvolution(cfg, tmp_path / "reference")
    rows = episode_results(batch)
    hooks.observe(rows, epoch=(step - 1) // 12, step=step)
    return hooks.reweight(batch.batch["advantages"].clone(), [list(r.tags) for r in rows], step=step)


def test_actor_sees_the_shared_apatch_advantages(seal_cfg, tmp_path, fake_actor_update):
    batch = make_batch()
    grpo = batch.batch["advantages"].clone()
    expected, _ = _reference(seal_cfg, tmp_path, make_batch(), step=3)
    trainer = make_trainer(seal_cfg, tmp_path / "run", step=3)

    out = trainer._update_actor(batch)

    assert torch.equal(fake_actor_update["advantages"], expected)
    assert not torch.allclose(expected, grpo), "A-Patch should rescale some rows of this batch"
    assert torch.equal(batch.batch["advantages"], expected)  # fit() logs the trained-on advantages
    metrics = out.meta_info["metrics"]
    assert metrics["actor/pg_loss"] == 0.25
    assert metrics["seal/observed_episodes"] == len(EPISODES)
    assert metrics["seal/apatch/scaled_count"] == len(EPISODES)
    assert any(k.startswith("seal/apatch/tag_weight/") for k in metrics)


def test_capability_state_observes_each_episode(seal_cfg, tmp_path, fake_actor_update):
    trainer = make_trainer(seal_cfg, tmp_path, step=1)
    trainer._update_actor(make_batch())
    state = trainer.coevolution.state.to_dict()
    text = json.dumps(state)
    assert "multi_turn_miss_func_7" in text and "spurious_tool_call" in text
    assert trainer.coevolution.state.observe_count == len(EPISODES)


def test_vanilla_rl_leaves_grpo_advantages_alone(vanilla_cfg, tmp_path, fake_actor_update):
    batch = make_batch()
    grpo = batch.batch["advantages"].clone()
    make_trainer(vanilla_cfg, tmp_path).seal_step(batch)
    assert torch.equal(batch.batch["advantages"], grpo)


def test_turn_credit_reaches_the_actor(seal_cfg, tmp_path, fake_actor_update):
    import dataclasses

    from seal.trainer.verl.batch import EPISODE_COLUMN
    from seal_shared.tags import turn_verdict

    cfg = copy.deepcopy(seal_cfg)
    cfg.seal.advantage.turn_credit = True
    batch = make_batch()
    column = batch.non_tensor_batch[EPISODE_COLUMN]
    column[:] = [dataclasses.replace(r, call_turns=(0,)) for r in column]  # one call, in the first turn
    reweighted, _ = _reference(seal_cfg, tmp_path, make_batch(), step=3)

    make_trainer(cfg, tmp_path / "run", step=3)._update_actor(batch)

    seen = fake_actor_update["advantages"]
    zeroed = 0
    for i, (reward, tags) in enumerate(EPISODES):
        right = turn_verdict(tags[0])
        disagree = torch.zeros_like(reweighted[i], dtype=torch.bool) if right is None else (
            (reweighted[i] < 0) if right else (reweighted[i] > 0))
        expected = torch.where(disagree, torch.zeros_like(reweighted[i]), reweighted[i])
        assert torch.equal(seen[i], expected), f"row {i}"
        zeroed += int(disagree.sum())
    assert zeroed > 0, "this batch has a failed episode whose first turn was right"


@pytest.mark.parametrize("faults", [{1: "env_fault", 6: "llm_fault"}, {2: "excluded"}], ids=["faults", "overflow"])
def test_excluded_episodes_are_not_trained_on(seal_cfg, tmp_path, fake_actor_update, faults):
    batch = make_batch(faults)
    trainer = make_trainer(seal_cfg, tmp_path, step=2)
    metrics = trainer._update_actor(batch).meta_info["metrics"]

    adv, mask = fake_actor_update["advantages"], fake_actor_update["response_mask"]
    for row in faults:
        assert not adv[row].any() and not mask[row].any()
    # The kept rows' GRPO baselines ignore the faulted rows' rewards.
    clean = make_batch(faults)
    keep = torch.tensor([i not in faults for i in range(len(EPISODES))])
    kept_adv, _ = compute_grpo_outcome_advantage(
        clean.batch["token_level_rewards"][keep], clean.batch["response_mask"][keep],
        clean.non_tensor_batch["uid"][keep.numpy()], norm_adv_by_std_in_grpo=True)
    rows = episode_results(clean)
    hooks = CoEvolution(seal_cfg, tmp_path / "reference")
    hooks.observe([r for r, k in zip(rows, keep) if k], epoch=0, step=2)
    expected, _ = hooks.reweight(kept_adv, [list(r.tags) for r, k in zip(rows, keep) if k], step=2)
    torch.testing.assert_close(adv[keep], expected)
    assert metrics["seal/excluded_episodes"] == len(faults)
    assert metrics["seal/observed_episodes"] == len(EPISODES) - len(faults)
    assert trainer.coevolution.state.observe_count == len(EPISODES) - len(faults)
    assert metrics["seal/env_faults"] == list(faults.values()).count("env_fault")


def test_epoch_end_dumps_stats_and_state(seal_cfg, tmp_path, fake_actor_update):
    trainer = make_trainer(seal_cfg, tmp_path, step=12, steps_per_epoch=12)
    trainer._update_actor(make_batch())
    assert (tmp_path / "diagnostic_stats" / "epoch_0.json").is_file()
    assert (tmp_path / "diagnostic_state" / "capability_state.json").is_file()


@pytest.mark.parametrize("hook", ["_compute_old_log_prob", "_compute_ref_log_prob", "seal_step"])
def test_missing_task_columns_are_a_clear_error(seal_cfg, tmp_path, fake_actor_update, hook):
    batch = make_batch()
    batch.non_tensor_batch.pop("task_id")
    batch.non_tensor_batch.pop(TRAINABLE_COLUMN)  # as rollout left it: no SEAL hook has run yet
    with pytest.raises(KeyError, match="default_agent_loop=seal"):
        getattr(make_trainer(seal_cfg, tmp_path), hook)(batch)


def _with_ckpt_dir(cfg, path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    cfg.trainer.default_local_dir = str(path)
    return cfg


def test_diagnosis_state_travels_with_verl_checkpoints(seal_cfg, tmp_path, fake_actor_update):
    cfg = _with_ckpt_dir(seal_cfg, tmp_path / "ckpt")
    first = make_trainer(cfg, tmp_path / "run", step=5)
    first._update_actor(make_batch(seed=1))
    first._save_checkpoint()  # verl's own save, on a stand-in worker group
    step_dir = tmp_path / "ckpt" / "global_step_5"
    assert (step_dir / SEAL_CKPT_DIR / "capability_state.json").is_file()
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "5"

    resumed = make_trainer(cfg, tmp_path / "run2", step=0)
    resumed._load_checkpoint()  # verl's resume_mode=auto finds global_step_5
    assert resumed.global_steps == 5
    assert resumed.actor_rollout_wg.loaded == [str(step_dir / "actor")]
    assert resumed.coevolution.state_dict() == first.coevolution.state_dict()
    assert resumed.coevolution.reweighter_state == first.coevolution.reweighter_state != {"tag_weights": {}}

    # The resumed hooks continue exactly as the original ones would.
    a = make_batch(seed=2)
    b = make_batch(seed=2)
    first.global_steps = resumed.global_steps = 6
    first.seal_step(a)
    resumed.seal_step(b)
    assert torch.equal(a.batch["advantages"], b.batch["advantages"])


def test_resume_from_a_checkpoint_without_seal_state_fails(seal_cfg, tmp_path):
    cfg = _with_ckpt_dir(seal_cfg, tmp_path / "ckpt")
    step_dir = tmp_path / "ckpt" / "global_step_3"
    (step_dir / "actor").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(ConfigError, match="resume_mode=disable"):
        make_trainer(cfg, tmp_path / "run", step=0)._load_checkpoint()


def test_fresh_run_loads_nothing(seal_cfg, tmp_path):
    cfg = _with_ckpt_dir(seal_cfg, tmp_path / "empty")
    trainer = make_trainer(cfg, tmp_path / "run", step=0)
    trainer._load_checkpoint()
    assert trainer.global_steps == 0 and trainer.coevolution.state.observe_count == 0
    assert N_ROLLOUTS * 2 == len(EPISODES)
