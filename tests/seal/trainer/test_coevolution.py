"""CoEvolution: the backend-agnostic SEAL side of a training step."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from seal.config import REPO_ROOT, compose_config
from seal.config_check import check_config
from seal.diagnosis.state import CapabilityState
from seal.episode import EpisodeResult, Evaluation
from seal.trainer.coevolution import HOOKS_FILE, STATE_FILE, CoEvolution
from seal_shared.types import FailureTag

SEAL_YAML = REPO_ROOT / "exp" / "SEAL.yaml"


_BASE = {}


def _hooks(tmp_path, *overrides):
    """Hooks on the paper's config plus ``key=value`` overrides (composed once per module)."""
    if "cfg" not in _BASE:
        _BASE["cfg"] = compose_config(SEAL_YAML)
    cfg = copy.deepcopy(_BASE["cfg"])
    for item in overrides:
        key, value = item.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    check_config(cfg, full=False)
    return CoEvolution(cfg, tmp_path)


def _episode(task="multi_turn_base_1", reward=0.0, tags=(FailureTag.STATE_MISMATCH,), **extra):
    evaluation = Evaluation.from_wire({"valid": reward >= 1.0, "failure_tags": [str(t) for t in tags]})
    return EpisodeResult(task, task.rsplit("_", 1)[0], evaluation=evaluation, reward=reward,
                         messages=({"role": "user", "content": "[ERROR] boom"},), **extra)


def test_env_params_modes_and_guidelines(tmp_path):
    hooks = _hooks(tmp_path, "env_service.bfcl.diagnostic_evolution.enable=true",
                   "env_service.bfcl.diagnostic_evolution.min_tag_count=2")
    train, val = hooks.env_params(train=True), hooks.env_params(train=False)
    assert train["rollout_mode"] == "sample" and val["rollout_mode"] == "validate"
    assert train["diagnostic_evolution"]["lines"] == []  # nothing observed yet
    assert "lines" not in val["diagnostic_evolution"]  # validation never gets guidelines
    hooks.observe([_episode(), _episode(), _episode()], epoch=0, step=1)
    lines = hooks.env_params(train=True)["diagnostic_evolution"]["lines"]
    assert len(lines) == 1 and lines[0] == hooks.guide_cfg.line_for(str(FailureTag.STATE_MISMATCH))
    # The base params are not mutated by the guideline selection.
    assert "lines" not in hooks.env_block["diagnostic_evolution"]


def test_observe_skips_faulted_episodes(tmp_path):
    hooks = _hooks(tmp_path)
    out = hooks.observe([_episode(), _episode(env_fault=True), _episode(llm_fault=True), _episode(excluded=True)],
                        epoch=0, step=1)
    assert out["seal/observed_episodes"] == 1.0 and out["seal/skipped_fault_episodes"] == 3.0
    assert hooks.state.observe_count == 1
    assert hooks.error_counter == {"[ERROR] boom": 1}


def test_reweight_scales_tagged_rows_only(tmp_path):
    hooks = _hooks(tmp_path, "seal.advantage.apatch.dynamic.enable=false")
    adv = torch.ones(3, 4)
    tags = [[str(FailureTag.SPURIOUS_TOOL_CALL)], None, [str(FailureTag.INSTANCE_MISMATCH)]]
    out, metrics = hooks.reweight(adv, tags, step=1)
    w = hooks.reweighter_cfg.tag_weights
    assert torch.allclose(out[0], adv[0] * w[str(FailureTag.SPURIOUS_TOOL_CALL)])
    assert torch.equal(out[1], adv[1])
    assert torch.allclose(out[2], adv[2] * w[str(FailureTag.INSTANCE_MISMATCH)])
    assert metrics["seal/apatch/scaled_count"] == 2.0 and all(k.startswith("seal/") for k in metrics)


def test_dynamic_weights_follow_the_state(tmp_path):
    hooks = _hooks(tmp_path)
    hooks.observe([_episode() for _ in range(8)], epoch=0, step=1)
    _, metrics = hooks.reweight(torch.ones(1, 2), [[str(FailureTag.STATE_MISMATCH)]], step=1)
    weight = hooks.reweighter_state["tag_weights"][str(FailureTag.STATE_MISMATCH)]  # A-Patch's own state
    assert weight > hooks.reweighter_cfg.tag_weights[str(FailureTag.STATE_MISMATCH)]  # prevalent, unsolved
    assert metrics["seal/apatch/mean_scale"] == pytest.approx(weight)
    assert hooks.step_metrics()["seal/diagnosis/dynamic_tag_weight/state_mismatch"] == weight
    assert "dynamic_tag_weights" not in hooks.state.to_dict()  # the capability state holds only the diagnosis


@pytest.mark.parametrize("override", ["seal.enable=false", "seal.advantage.reweighter=identity"])
def test_disabled_or_identity_leaves_advantages(tmp_path, override):
    hooks = _hooks(tmp_path, override)
    adv = torch.randn(2, 3)
    out, metrics = hooks.reweight(adv, [[str(FailureTag.SPURIOUS_TOOL_CALL)], None], step=1)
    assert torch.equal(out, adv) and metrics == {"seal/apatch/enabled": 0.0}
    assert hooks.reweighter_state == {}
    if override == "seal.enable=false":
        assert hooks.state is None and hooks.step_metrics() == {}
        hooks.observe([_episode()], epoch=0, step=1)
        hooks.end_epoch(0, 1)
        assert not (tmp_path / "diagnostic_state").exists()


def test_end_epoch_saves_before_reset(tmp_path):
    hooks = _hooks(tmp_path)
    hooks.observe([_episode(), _episode(reward=1.0, tags=[FailureTag.PASS])], epoch=0, step=3)
    hooks.end_epoch(0, 3)
    stats = json.loads((tmp_path / "diagnostic_stats" / "epoch_0.json").read_text())
    saved = CapabilityState.load(tmp_path / "diagnostic_state" / STATE_FILE)
    assert stats["global_step"] == 3 and stats["top_errors"] == [{"message": "[ERROR] boom", "count": 2}]
    assert stats["dynamic_tag_weights"] == {}  # no reweight yet
    assert sum(s.count for s in saved.window["categories"].values()) == 2  # the window was saved ...
    assert hooks.state.window["categories"] == {}  # ... and then reset
    assert hooks.error_counter == {}


def test_save_load_round_trip_is_byte_identical(tmp_path):
    hooks = _hooks(tmp_path / "a")
    hooks.observe([_episode(), _episode(reward=1.0, tags=[FailureTag.PASS])], epoch=0, step=1)
    hooks.reweight(torch.ones(1, 1), [[str(FailureTag.STATE_MISMATCH)]], step=1)
    hooks.save(tmp_path / "ckpt")
    other = _hooks(tmp_path / "b")
    other.load(tmp_path / "ckpt")
    other.save(tmp_path / "ckpt2")
    for name in (STATE_FILE, HOOKS_FILE):
        assert (tmp_path / "ckpt" / name).read_bytes() == (tmp_path / "ckpt2" / name).read_bytes()
    assert other.state_dict() == hooks.state_dict() and other.reweighter_state["tag_weights"]
    # The next step's weights continue from the restored ones, as without the round trip.
    for h in (hooks, other):
        h.observe([_episode()], epoch=0, step=2)
    (a, metrics_a), (b, metrics_b) = (h.reweight(torch.ones(1, 1), [["state_mismatch"]], step=2) for h in (other, hooks))
    assert torch.equal(a, b) and metrics_a == metrics_b
    assert other.reweighter_state == hooks.reweighter_state


def test_a_checkpoint_of_the_previous_layout_still_loads(tmp_path):
    """Version 1 kept A-Patch's dynamic weights inside the capability state file."""
    hooks = _hooks(tmp_path / "a")
    hooks.observe([_episode()], epoch=0, step=1)
    hooks.reweight(torch.ones(1, 1), [[str(FailureTag.STATE_MISMATCH)]], step=1)
    hooks.save(tmp_path / "ckpt")
    weights = hooks.reweighter_state["tag_weights"]
    state = json.loads((tmp_path / "ckpt" / STATE_FILE).read_text())
    (tmp_path / "ckpt" / STATE_FILE).write_text(json.dumps({**state, "dynamic_tag_weights": weights}))
    (tmp_path / "ckpt" / HOOKS_FILE).write_text(json.dumps({"version": 1, "enabled": True, "error_counter": {}}))
    old = _hooks(tmp_path / "b")
    old.load(tmp_path / "ckpt")
    assert old.reweighter_state == {"tag_weights": weights} and old.state.to_dict() == hooks.state.to_dict()


def test_fresh_hooks_never_load_a_left_over_state(tmp_path):
    old = _hooks(tmp_path)
    old.observe([_episode()], epoch=0, step=1)
    old.save_state()
    fresh = _hooks(tmp_path)
    assert fresh.state.observe_count == 0
    with pytest.raises(FileNotFoundError):
        fresh.load(tmp_path / "no_checkpoint_here")
