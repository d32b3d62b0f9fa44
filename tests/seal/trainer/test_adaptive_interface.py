"""exp/extensions/adaptive_interface.yaml: recovery feedback and guideline evolution on for
training episodes, driven by the capability state, never delivered to validation episodes.

Three local training steps with a scripted policy whose failures change from step to step
(spurious tool calls, then state mismatches, then empty turns): the guideline lines sent with
each step's training episodes follow the failures diagnosed so far, and every validation
episode (before training and after each step) gets the untouched interface.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from seal.config import REPO_ROOT, compose_config
from seal_shared.interface.episode import EpisodeInterface
from seal_shared.interface.guidelines import DEFAULT_GUIDELINES, GUIDELINES_HEADER
from seal_shared.types import FailureTag

ADAPTIVE = REPO_ROOT / "exp" / "extensions" / "adaptive_interface.yaml"
TRAIN = ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_3", "multi_turn_miss_param_4"]
# The failure tag of every failed turn, per training step (1-based).
SCHEDULE = {1: FailureTag.SPURIOUS_TOOL_CALL, 2: FailureTag.STATE_MISMATCH, 3: FailureTag.EMPTY_TURN_MODEL_RESPONSE}
EPISODES_PER_STEP = len(TRAIN) * 2  # 4 tasks, n = 2
TOOL_ERROR = "Error during execution: No such file or directory"


def _leaves(cfg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        else:
            out[path] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def test_yaml_is_the_paper_recipe_plus_the_two_switches():
    seal, adaptive = _leaves(compose_config(REPO_ROOT / "exp" / "SEAL.yaml")), _leaves(compose_config(ADAPTIVE))
    changed = {k for k in seal.keys() | adaptive.keys() if seal.get(k) != adaptive.get(k)}
    assert changed == {"env_service.bfcl.tool_feedback_evolution.enable",
                       "env_service.bfcl.diagnostic_evolution.enable", "trainer.experiment_name"}
    assert adaptive["env_service.bfcl.tool_feedback_evolution.apply_to_validation"] is False
    assert adaptive["env_service.bfcl.diagnostic_evolution.apply_to_validation"] is False


class PhasedRunner:
    """The scripted runner with the failed episodes' tags set by the current training step."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.train_calls = 0

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.inner.calls

    async def run(self, sampling_params: dict, *, task_id: str, rollout_mode: str, env_params: dict,
                  **kwargs: Any) -> Any:
        out = await self.inner.run(sampling_params, task_id=task_id, rollout_mode=rollout_mode,
                                   env_params=env_params, **kwargs)
        self.inner.calls[-1]["step"] = None
        if rollout_mode == "sample":
            step = 1 + self.train_calls // EPISODES_PER_STEP
            self.train_calls += 1
            self.inner.calls[-1]["step"] = step
            if not out.extra_fields["check"]["valid"]:
                out = self.inner.with_verdict(out, tags=[str(SCHEDULE[step])] * 2)
        return out


def _overrides() -> list[str]:
    """The adaptive file's interface blocks, applied to the CPU test config."""
    bfcl = compose_config(ADAPTIVE).env_service.bfcl
    out = []
    for block in ("tool_feedback_evolution", "diagnostic_evolution"):
        for key in ("enable", "apply_to_validation"):
            out.append(f"env_service.bfcl.{block}.{key}={str(bfcl[block][key]).lower()}")
    return out


def test_guidelines_follow_the_capability_state_and_skip_validation(tmp_path, make_trainer, scripted_runner):
    runner = PhasedRunner(scripted_runner())
    trainer, _ = make_trainer(tmp_path / "adaptive", runner=runner, extra=[
        *_overrides(), f"seal.tasks.train_ids=[{','.join(TRAIN)}]",
        # 4 tasks per step: each step is one epoch, so the capability state's window (which
        # guideline selection reads) holds exactly the previous step's episodes.
        "data.train_batch_size=4", "trainer.total_training_steps=3", "trainer.val_before_train=true",
        "trainer.test_freq=1", "trainer.save_freq=0"])
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_step == 3

    train = [c for c in runner.calls if c["rollout_mode"] == "sample"]
    val = [c for c in runner.calls if c["rollout_mode"] == "validate"]
    assert len(train) == 3 * EPISODES_PER_STEP and len(val) == 4 * 2  # before training + after each step
    lines = {s: {tuple(c["env_params"]["diagnostic_evolution"]["lines"]) for c in train if c["step"] == s}
             for s in SCHEDULE}
    assert all(len(v) == 1 for v in lines.values()), lines  # one set of lines per step, for all its episodes
    lines = {s: next(iter(v)) for s, v in lines.items()}
    assert lines[1] == ()  # nothing diagnosed yet
    assert lines[2] == (DEFAULT_GUIDELINES[SCHEDULE[1]],)  # last step's failures
    # Step 3, hand count: each step ends an epoch and resets the state's window, so selection
    # reads the totals of steps 1-2: spurious 8, state_mismatch 8, pass 16 turns (prevalence
    # 0.25 each, reward mean 0): both kept, tied, in tag-name order.
    assert lines[3] == (DEFAULT_GUIDELINES[SCHEDULE[1]], DEFAULT_GUIDELINES[SCHEDULE[2]])

    for c in train:
        iface = EpisodeInterface.from_params(c["env_params"], category="multi_turn_base")
        assert iface.active["tool_feedback_evolution"] and iface.active["diagnostic_evolution"]
        assert (any(GUIDELINES_HEADER in b for b in iface.system_blocks())) == bool(lines[c["step"]])
        assert iface.tool_error_feedback(TOOL_ERROR, tool_names=["cd", "ls"]).startswith("[ToolHint]")
        assert iface.parse_error_feedback("no tool call parsed", parser_mode="llama3_json", tool_names=["cd"])
    for c in val:
        params = c["env_params"]
        assert not params["diagnostic_evolution"].get("lines")
        iface = EpisodeInterface.from_params(params, category="multi_turn_base")
        assert iface.is_validation and not any(iface.active.values())
        assert iface.system_blocks() == []
        assert iface.tool_error_feedback(TOOL_ERROR, tool_names=["cd", "ls"]) == ""
        assert iface.parse_error_feedback("no tool call parsed", parser_mode="llama3_json", tool_names=["cd"]) == ""
