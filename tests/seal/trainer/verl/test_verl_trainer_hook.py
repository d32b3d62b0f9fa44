"""The SEAL step inside verl's V1 step: same advantages as the shared A-Patch code, faults kept out
of the update, metrics passed to verl's logging, state saved with checkpoints.

Each step is verl's own ``_step_once`` (:func:`verl_testkit.run_step`) on episodes that verl's
agent-loop post-processing put into TransferQueue; the worker groups are stand-ins that read and
write TransferQueue, and the actor update records what it would train on.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from verl_testkit import EPISODES, N_ROLLOUTS, make_step, make_trainer, padded, read_rows, run_step

pytest.importorskip("verl")

from seal.advantage.grpo import grpo_advantages  # noqa: E402
from seal.config import ConfigError  # noqa: E402
from seal.episode import EpisodeResult  # noqa: E402
from seal.trainer.coevolution import CoEvolution  # noqa: E402
from seal.trainer.verl.trainer import SEAL_CKPT_DIR  # noqa: E402

pytestmark = pytest.mark.usefixtures("transfer_queue")


def _snapshot(batch):
    """Per key, what the agent loop put: reward tokens, loss mask, group id, record."""
    rows = read_rows(batch.keys, "rm_scores", "response_mask", "uid", "extra_fields")
    return {k: {"scores": rows["rm_scores"][i], "mask": rows["response_mask"][i], "uid": rows["uid"][i],
                "record": EpisodeResult.from_fields(rows["extra_fields"][i])} for i, k in enumerate(batch.keys)}


def _reference(cfg, exp_dir, snap, keys, *, step, kept=None):
    """What the shared code computes for these rows (in ``keys`` order): GRPO over the kept rows
    (``kept``: all but the excluded), the capability state observing the episodes, then the
    configured reweighter. Returns (GRPO advantages, reweighted advantages)."""
    records = [snap[k]["record"] for k in keys]
    kept = [not r.excluded for r in records] if kept is None else kept
    mask = padded([snap[k]["mask"] * int(keep) for k, keep in zip(keys, kept)])
    grpo = grpo_advantages(padded([snap[k]["scores"] for k in keys]), mask, [snap[k]["uid"] for k in keys])
    hooks = CoEvolution(cfg, exp_dir)
    hooks.observe(records, epoch=(step - 1) // 12, step=step)
    tags = [list(r.tags) if keep else None for r, keep in zip(records, kept)]
    return grpo, hooks.reweight(grpo.clone(), tags, step=step)[0]


def test_actor_sees_the_shared_apatch_advantages(seal_cfg, tmp_path):
    batch = make_step()
    snap = _snapshot(batch)
    trainer = make_trainer(seal_cfg, tmp_path / "run", step=3)

    _, metrics = run_step(trainer, batch)

    (update,) = trainer.actor_rollout_wg.updates
    grpo, expected = _reference(trainer.config, tmp_path / "reference", snap, update.keys, step=3)
    assert torch.equal(update.padded("advantages", update.keys), expected)
    assert not torch.allclose(expected, grpo), "A-Patch should rescale some rows of this batch"
    # verl's step metrics read the advantages from TransferQueue: the trained-on ones.
    assert torch.equal(padded(read_rows(update.keys, "advantages")["advantages"]), expected)
    assert metrics["actor/pg_loss"] == 0.25
    assert metrics["seal/observed_episodes"] == len(EPISODES)
    assert metrics["seal/apatch/scaled_count"] == len(EPISODES)
    assert any(k.startswith("seal/apatch/tag_weight/") for k in metrics)


def test_capability_state_observes_each_episode(seal_cfg, tmp_path):
    trainer = make_trainer(seal_cfg, tmp_path, step=1)
    run_step(trainer, make_step())
    text = json.dumps(trainer.coevolution.state.to_dict())
    assert "multi_turn_miss_func_7" in text and "spurious_tool_call" in text
    assert trainer.coevolution.state.observe_count == len(EPISODES)


def test_vanilla_rl_leaves_grpo_advantages_alone(vanilla_cfg, tmp_path):
    batch = make_step()
    snap = _snapshot(batch)
    trainer = make_trainer(vanilla_cfg, tmp_path, step=3)
    run_step(trainer, batch)
    (update,) = trainer.actor_rollout_wg.updates
    grpo, _ = _reference(trainer.config, tmp_path / "reference", snap, update.keys, step=3)
    assert torch.equal(update.padded("advantages", update.keys), grpo)


def test_turn_credit_reaches_the_actor(seal_cfg, tmp_path):
    from seal_shared.tags import turn_verdict

    cfg = copy.deepcopy(seal_cfg)
    cfg.seal.advantage.turn_credit = True
    batch = make_step(call_turns=(0,))  # one call, in the first turn
    snap = _snapshot(batch)
    trainer = make_trainer(cfg, tmp_path / "run", step=3)

    run_step(trainer, batch)

    (update,) = trainer.actor_rollout_wg.updates
    _, reweighted = _reference(seal_cfg, tmp_path / "reference", snap, update.keys, step=3)
    seen = update.padded("advantages", update.keys)
    zeroed = 0
    for i, key in enumerate(update.keys):
        right = turn_verdict(snap[key]["record"].tags[0])
        disagree = torch.zeros_like(reweighted[i], dtype=torch.bool) if right is None else (
            (reweighted[i] < 0) if right else (reweighted[i] > 0))
        assert torch.equal(seen[i], torch.where(disagree, torch.zeros_like(reweighted[i]), reweighted[i])), key
        zeroed += int(disagree.sum())
    assert zeroed > 0, "this batch has a failed episode whose first turn was right"


@pytest.mark.parametrize(("faults", "lone"), [
    ({1: "env_fault", 6: "llm_fault"}, set()),
    ({2: "excluded"}, set()),
    ({0: "env_fault", 1: "llm_fault", 2: "env_fault"}, {3}),  # row 3 is its group's lone survivor
], ids=["faults", "overflow", "lone_survivor"])
def test_excluded_episodes_and_lone_survivors_are_not_trained_on(seal_cfg, tmp_path, faults, lone):
    batch = make_step(faults)
    snap = _snapshot(batch)
    trainer = make_trainer(seal_cfg, tmp_path, step=2)
    _, metrics = run_step(trainer, batch)

    (update,) = trainer.actor_rollout_wg.updates
    index = {k: i for i, k in enumerate(batch.keys)}
    left_out = set(faults) | lone
    kept = [index[k] not in left_out for k in update.keys]
    for key, keep in zip(update.keys, kept):
        if not keep:
            assert not update.rows["advantages"][key].any(), key
            assert not update.rows["response_mask"][key].any() and not update.rows["loss_mask"][key].any(), key
    # The agent loop zeroed the faulted episodes' masks; a lone survivor's the step rules zeroed.
    assert not any(snap[batch.keys[row]]["mask"].any() for row in faults)
    assert all(snap[batch.keys[row]]["mask"].any() for row in lone)
    # The kept rows' GRPO baselines ignore the rows left out; the state saw every played episode.
    _, expected = _reference(trainer.config, tmp_path / "reference", snap, update.keys, step=2, kept=kept)
    torch.testing.assert_close(update.padded("advantages", update.keys), expected)
    assert metrics["seal/excluded_episodes"] == len(faults) and metrics["seal/lone_survivors"] == len(lone)
    assert metrics["seal/trained_episodes"] == len(EPISODES) - len(left_out)
    assert metrics["seal/observed_episodes"] == len(EPISODES) - len(faults)
    assert trainer.coevolution.state.observe_count == len(EPISODES) - len(faults)
    assert metrics["seal/env_faults"] == list(faults.values()).count("env_fault")


def test_epoch_end_dumps_stats_and_state(seal_cfg, tmp_path):
    trainer = make_trainer(seal_cfg, tmp_path, step=12, steps_per_epoch=12)
    run_step(trainer, make_step())
    assert (tmp_path / "diagnostic_stats" / "epoch_0.json").is_file()
    assert (tmp_path / "diagnostic_state" / "capability_state.json").is_file()


def test_no_epoch_dump_before_the_epoch_ends(seal_cfg, tmp_path):
    run_step(make_trainer(seal_cfg, tmp_path, step=11, steps_per_epoch=12), make_step())
    assert not (tmp_path / "diagnostic_stats").exists()


@pytest.mark.parametrize("seam", ["_balance_batch", "_update_actor"])
def test_a_batch_without_seal_records_is_a_clear_error(seal_cfg, tmp_path, seam):
    """The records are read where the step rules run (after verl balances the batch), or by the
    actor-update seam when no step rules ran; another agent loop's episodes fail in one line."""
    trainer = make_trainer(seal_cfg, tmp_path)
    with pytest.raises(KeyError, match="default_agent_loop=seal") as info:
        getattr(trainer, seam)(make_step(records=False), {})
    assert "\n" not in str(info.value)
    assert trainer.actor_rollout_wg.updates == []


def _with_ckpt_dir(cfg, path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    cfg.trainer.default_local_dir = str(path)
    return cfg


def test_diagnosis_state_travels_with_verl_checkpoints(seal_cfg, tmp_path):
    cfg = _with_ckpt_dir(seal_cfg, tmp_path / "ckpt")
    first = make_trainer(cfg, tmp_path / "run", step=5)
    run_step(first, make_step(seed=1))
    first._save_checkpoint()  # SEAL's state, then verl's own save on the stand-in worker group
    step_dir = tmp_path / "ckpt" / "global_step_5"
    assert (step_dir / SEAL_CKPT_DIR / "capability_state.json").is_file()
    assert (step_dir / "data.pt").is_file() and first.actor_rollout_wg.saved == [(str(step_dir / "actor"), 5)]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "5"

    resumed = make_trainer(cfg, tmp_path / "run2", step=0)
    resumed._load_checkpoint()  # verl's resume_mode=auto finds global_step_5
    assert resumed.global_steps == 5 and resumed.train_dataloader.restored == {"consumed": 12}
    assert resumed.actor_rollout_wg.loaded == [str(step_dir / "actor")]
    assert resumed.coevolution.state_dict() == first.coevolution.state_dict()
    assert resumed.coevolution.reweighter_state == first.coevolution.reweighter_state != {"tag_weights": {}}

    # The resumed hooks continue exactly as the original ones would, on the same episodes.
    a, b = make_step(seed=2), make_step(seed=2)
    first.global_steps = resumed.global_steps = 6
    run_step(first, a)
    run_step(resumed, b)
    seen_a = first.actor_rollout_wg.updates[-1].padded("advantages", a.keys)
    seen_b = resumed.actor_rollout_wg.updates[-1].padded("advantages", b.keys)
    assert torch.equal(seen_a, seen_b) and seen_a.any()


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
    assert trainer.actor_rollout_wg.loaded == [] and N_ROLLOUTS * 2 == len(EPISODES)
