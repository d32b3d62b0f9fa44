"""The verl methods the SEAL trainer overrides or calls exist in the pinned verl, with the
signatures and call order the subclass relies on. A verl upgrade that moves them fails here."""

from __future__ import annotations

import importlib.metadata
import inspect
import re

import pytest

pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopWorker  # noqa: E402
from verl.trainer.main_ppo import run_ppo  # noqa: E402
from verl.trainer.main_ppo_v0 import BaseTaskRunner  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402

from seal.trainer.verl.trainer import SealRayPPOTrainer  # noqa: E402

PINNED_VERL = "0.9.1"


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_verl_is_the_pinned_version():
    assert importlib.metadata.version("verl") == PINNED_VERL


@pytest.mark.parametrize(("name", "params"), [
    ("_update_actor", ["self", "batch"]),
    ("_get_gen_batch", ["self", "batch"]),
    ("_save_checkpoint", ["self"]),
    ("_load_checkpoint", ["self"]),
    ("_compute_old_log_prob", ["self", "batch"]),
    ("_compute_ref_log_prob", ["self", "batch"]),
    ("_validate", ["self", "merged"]),
    ("_dump_generations", ["self", "inputs", "outputs", "gts", "scores", "reward_extra_infos_dict", "dump_path"]),
])
def test_overridden_hooks_exist_with_the_expected_signature(name, params):
    base = getattr(RayPPOTrainer, name)
    assert _params(base) == params
    assert _params(getattr(SealRayPPOTrainer, name)) == params
    assert getattr(SealRayPPOTrainer, name) is not base


def test_subclass_overrides_only_these_methods():
    own = {k for k, v in vars(SealRayPPOTrainer).items() if callable(v) and k in vars(RayPPOTrainer)}
    assert own == {"__init__", "_update_actor", "_get_gen_batch", "_save_checkpoint", "_load_checkpoint",
                   "_dump_generations", "_compute_old_log_prob", "_compute_ref_log_prob", "_validate"}
    assert "fit" not in vars(SealRayPPOTrainer)


def _position(source: str, pattern: str) -> int:
    match = re.search(pattern, source)
    assert match, f"fit() no longer contains {pattern!r}"
    return match.start()


def test_fit_calls_update_actor_after_grpo_advantages_and_before_checkpoint_and_logging():
    source = inspect.getsource(RayPPOTrainer.fit)
    gen = _position(source, r"self\._get_gen_batch\(batch\)")
    adv = _position(source, r"batch = compute_advantage\(")
    update = _position(source, r"self\._update_actor\(batch\)")
    metrics = _position(source, r"actor_output\.meta_info\[\"metrics\"\]")
    save = _position(source, r"self\._save_checkpoint\(\)")
    log = _position(source, r"logger\.log\(data=metrics")
    load = _position(source, r"self\._load_checkpoint\(\)")
    assert load < gen < adv < update < save < log and update < metrics < log
    # No other trainer method is called between the advantages and the actor update but the
    # critic update (GRPO has no critic).
    between = source[adv:update]
    assert set(re.findall(r"self\.(_\w+)\(", between)) <= {"_update_critic"}


def test_old_log_probs_come_before_the_rollout_correction():
    """The step with nothing to train on relies on this order: ``_compute_old_log_prob`` drops
    ``rollout_log_probs`` before verl's rollout correction (which needs a valid token) looks for them."""
    source = inspect.getsource(RayPPOTrainer.fit)
    old = _position(source, r"self\._compute_old_log_prob\(batch\)")
    ref = _position(source, r"self\._compute_ref_log_prob\(batch\)")
    corr = _position(source, r"\"rollout_log_probs\" in batch\.batch\s+and not bypass_recomputing_logprobs")
    adv = _position(source, r"batch = compute_advantage\(")
    assert old < ref < corr < adv


def test_validation_also_builds_its_generation_batch_with_the_hook():
    source = inspect.getsource(RayPPOTrainer._validate)
    assert "self._get_gen_batch(test_batch)" in source
    # The validation log receives every reward_extra_info column of the episodes.
    assert "reward_extra_infos_dict[key].extend(values" in source
    assert "reward_extra_infos_dict=reward_extra_infos_dict" in source and "self._dump_generations(" in source


def test_task_runner_helpers_and_run_ppo():
    for name in ("add_actor_rollout_worker", "add_critic_worker", "add_reward_model_resource_pool",
                 "add_teacher_model_resource_pool", "add_ref_policy_worker", "init_resource_pool_mgr"):
        assert callable(getattr(BaseTaskRunner, name)), name
    assert _params(run_ppo) == ["config", "task_runner_class"]
    source = inspect.getsource(run_ppo)
    assert "task_runner_class.remote()" in source and "runner.run.remote(config)" in source


def test_agent_loop_contract():
    assert _params(AgentLoopBase.run) == ["self", "sampling_params", "kwargs"]
    source = inspect.getsource(AgentLoopWorker.generate_sequences)
    # Every non-tensor column of the generation batch reaches run() as a keyword argument.
    assert "kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items()" in source
    assert "agent_loop_config_path" in inspect.getsource(AgentLoopWorker.__init__)


def test_the_fsdp_engine_never_applies_the_prefix_grouper():
    """Why the config pass refuses ``actor.use_prefix_grouper=true`` on the verl backend: in the
    pinned verl the FSDP engine patches the model without the grouper, and no worker calls its
    forward; only the trainer's batch balancing reads the flag. A verl that wires it in fails here
    (then the refusal should go and the recipes could turn it on)."""
    import ast
    from pathlib import Path

    import verl
    from verl.workers.engine.fsdp import transformer_impl

    calls = [node for node in ast.walk(ast.parse(inspect.getsource(transformer_impl)))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "apply_monkey_patch"]
    assert calls, "the FSDP engine no longer calls apply_monkey_patch"
    assert all("use_prefix_grouper" not in {k.arg for k in call.keywords} for call in calls)
    workers = Path(verl.__file__).parent / "workers"
    readers = [p for p in workers.rglob("*.py")
               if "prefix_grouper" in p.read_text(encoding="utf-8") and p.name != "actor.py"]
    assert readers == [], readers
