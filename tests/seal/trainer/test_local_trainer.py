"""The local trainer's loop on a tiny random model with a scripted episode runner."""

from __future__ import annotations

import json
import math

import torch

from seal.eval.logs import read_log_dir


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_steps_write_every_output(tmp_path, make_trainer):
    exp = tmp_path / "run"
    trainer, runner = make_trainer(exp)
    before = _params(trainer.model)
    try:
        trainer.fit()
    finally:
        trainer.close()
    # The policy moved (weight decay is 0 here, so only gradients can move it) ...
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # ... and the reference policy did not.
    ref = trainer.ref_model.state_dict()
    assert all(torch.equal(before[k], ref[k]) for k in before)

    lines = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        assert math.isfinite(m["actor/loss"]) and math.isfinite(m["actor/pg_loss"])
        assert m["seal/trained_episodes"] == 4.0
        assert m["seal/apatch/scaled_count"] == 4.0  # every scripted episode carries tags
    assert "val/pass_rate" in lines[0] and "val/pass_rate" in lines[2]

    # The validation logs (seal.eval.logs).
    logs = read_log_dir(exp / "validation_log")
    assert sorted(logs) == [0, 2]
    assert {r["task_id"] for r in logs[2]} == set(trainer.val_ids)
    assert all(r["generation"]["temperature"] == 0.0 for r in logs[0])
    stats = json.loads((exp / "diagnostic_stats" / "epoch_0.json").read_text())
    assert stats["epoch"] == 0 and stats["observe_count"] == 8
    state = json.loads((exp / "diagnostic_state" / "capability_state.json").read_text())
    assert sum(s["count"] for s in state["window_categories"].values()) == 8  # saved before the reset
    assert (exp / "checkpoints" / "global_step_2" / "model.pt").is_file()
    assert (exp / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "2"

    # Training episodes were sampled (n=2 per task, rollout temperature); validation greedy, once per task.
    train_calls = [c for c in runner.calls if c["rollout_mode"] == "sample"]
    val_calls = [c for c in runner.calls if c["rollout_mode"] == "validate"]
    assert len(train_calls) == 8 and len(val_calls) == 4
    assert all(c["sampling_params"]["temperature"] == 1.0 for c in train_calls)
    assert all(c["env_params"]["rollout_mode"] == "validate" for c in val_calls)


def test_apatch_scales_reach_the_update(tmp_path, make_trainer, monkeypatch):
    """The advantages handed to the policy update are GRPO's times each episode's A-Patch scale."""
    from seal.trainer.local import loop

    seen = {}
    real_update = loop.policy_update
    real_grpo = loop.grpo_advantages_verl

    def grpo(batch, **kw):
        seen["grpo"] = real_grpo(batch, **kw)
        seen["batch"] = batch
        return seen["grpo"]

    def update(model, ref, opt, batch, adv, *a, **kw):
        seen["adv"] = adv
        return real_update(model, ref, opt, batch, adv, *a, **kw)

    monkeypatch.setattr(loop, "grpo_advantages_verl", grpo)
    monkeypatch.setattr(loop, "policy_update", update)
    trainer, _ = make_trainer(tmp_path / "run", extra=["trainer.total_training_steps=1", "trainer.val_before_train=false"])
    try:
        trainer.fit()
    finally:
        trainer.close()
    weights = trainer.coevolution.reweighter_state["tag_weights"]
    cfg = trainer.coevolution.reweighter_cfg
    for i, ep in enumerate(seen["batch"].episodes):
        scale = sum(weights[t] for t in ep.tags) / len(ep.tags)
        scale = min(max(scale, cfg.min_scale), cfg.max_scale)
        torch.testing.assert_close(seen["adv"][i], seen["grpo"][i] * scale)
    # The loss mask is exactly the episodes' response masks (observation tokens excluded).
    for i, ep in enumerate(seen["batch"].episodes):
        assert seen["batch"].mask[i, : len(ep.response_mask)].tolist() == [float(m) for m in ep.response_mask]


def test_sampled_validation_plays_n_episodes_per_task_beside_the_greedy_pass(tmp_path, make_trainer):
    """``seal.local.sampled_validation_n``: the greedy pass as before, then n sampled episodes per
    validation task at the configured temperature, logged apart and as ``val_sampled/*``."""
    exp = tmp_path / "run"
    trainer, runner = make_trainer(exp, extra=["trainer.total_training_steps=1", "trainer.test_freq=1",
                                               "seal.local.sampled_validation_n=3",
                                               "seal.local.sampled_validation_temperature=0.7"])
    try:
        trainer.fit()
    finally:
        trainer.close()
    lines = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    for m in (lines[0], lines[-1]):
        assert 0.0 <= m["val/pass_rate"] <= 1.0 and 0.0 <= m["val_sampled/pass_rate"] <= 1.0
        assert m["val_sampled/faults"] == 0.0
    greedy, sampled = read_log_dir(exp / "validation_log"), read_log_dir(exp / "validation_log_sampled")
    assert sorted(greedy) == sorted(sampled) == [0, 1]
    for step in (0, 1):
        assert len(greedy[step]) == len(trainer.val_ids)
        assert sorted(r["task_id"] for r in sampled[step]) == sorted(trainer.val_ids * 3)
        assert all(r["generation"]["temperature"] == 0.7 for r in sampled[step])
    val_calls = [c for c in runner.calls if c["rollout_mode"] == "validate"]
    assert len(val_calls) == 2 * 4 * len(trainer.val_ids)  # two validations, greedy + 3 sampled per task
    assert sorted({c["sampling_params"]["temperature"] for c in val_calls}) == [0.0, 0.7]
    assert all(c["env_params"]["rollout_mode"] == "validate" for c in val_calls)
