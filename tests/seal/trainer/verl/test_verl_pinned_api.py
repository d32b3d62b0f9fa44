"""The verl methods the SEAL trainer overrides or relies on exist in the pinned verl (V1 trainer),
with the signatures and call order the subclass relies on. A verl upgrade that moves them fails here."""

from __future__ import annotations

import importlib.metadata
import inspect
import re

import pytest

pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, AgentLoopWorker  # noqa: E402
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo  # noqa: E402
from verl.trainer.ppo import padding_utils  # noqa: E402
from verl.trainer.ppo.v1 import PPOTrainerSync  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from seal.trainer.verl.main import SealTaskRunner  # noqa: E402
from seal.trainer.verl.trainer import SealPPOTrainer  # noqa: E402

PINNED_VERL = "0.9.1"
PINNED_TRANSFERQUEUE = "0.1.11"

OVERRIDDEN = {
    "_balance_batch": ["self", "batch", "metrics", "logging_prefix", "keep_minibatch"],
    "_compute_old_log_prob": ["self", "batch", "metrics"],
    "_compute_ref_log_prob": ["self", "batch", "metrics"],
    "_compute_advantage": ["self", "batch", "metrics"],
    "_update_actor": ["self", "batch", "metrics"],
    "_save_checkpoint": ["self"],
    "_load_checkpoint": ["self"],
    "_validate": ["self"],
    "_dump_generations": ["self", "inputs", "outputs", "gts", "scores", "reward_extra_infos_dict", "dump_path"],
    "_init_dataloader": ["self"],
    "_init_resource_pool_mgr": ["self"],
    "fit": ["self", "agent_loop_manager"],
}


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _source(fn) -> str:
    """The source of a function, or of a method of a Ray actor class (the class under the wrapper)."""
    return inspect.getsource(fn)


def _actor_method(actor, name: str):
    return getattr(actor.__ray_metadata__.modified_class, name)


def _position(source: str, pattern: str) -> int:
    match = re.search(pattern, source)
    assert match, f"the source no longer contains {pattern!r}"
    return match.start()


def test_verl_and_transferqueue_are_the_pinned_versions():
    assert importlib.metadata.version("verl") == PINNED_VERL
    assert importlib.metadata.version("transferqueue") == PINNED_TRANSFERQUEUE


@pytest.mark.parametrize(("name", "params"), list(OVERRIDDEN.items()))
def test_overridden_methods_exist_with_the_expected_signature(name, params):
    base = getattr(PPOTrainerSync, name)
    assert base is getattr(PPOTrainer, name)  # the sync trainer keeps the base class's
    assert _params(base) == params
    assert _params(getattr(SealPPOTrainer, name)) == params
    assert getattr(SealPPOTrainer, name) is not base


def test_the_subclass_overrides_only_these_methods():
    own = {k for k, v in vars(SealPPOTrainer).items() if callable(v) and hasattr(PPOTrainerSync, k)}
    assert own == {"__init__", *OVERRIDDEN}
    assert SealPPOTrainer.__mro__[1] is PPOTrainerSync
    assert _params(PPOTrainerSync.__init__) == ["self", "config"]


def test_step_once_runs_the_seams_in_order():
    """The step rules (in ``_balance_batch``) come before every log-prob and the advantages; the
    actor update (A-Patch) after the advantages, with only the critic update between them."""
    source = _source(PPOTrainer._step_once)
    sample = _position(source, r"self\.replay_buffer\.sample\(")
    balance = _position(source, r"batch = self\._balance_batch\(batch, metrics=metrics\)")
    old = _position(source, r"batch = self\._compute_old_log_prob\(batch, metrics=metrics\)")
    ref = _position(source, r"batch = self\._compute_ref_log_prob\(batch, metrics=metrics\)")
    adv = _position(source, r"batch = self\._compute_advantage\(batch, metrics=metrics\)")
    update = _position(source, r"batch = self\._update_actor\(batch, metrics=metrics\)")
    assert sample < balance < old < ref < adv < update
    after_adv = source.index("(batch, metrics=metrics)", adv)
    assert set(re.findall(r"self\.(_\w+)\(", source[after_adv:update])) <= {"_update_critic"}
    # The actor update is skipped only during critic warm-up, which the config check refuses.
    assert "self.config.trainer.critic_warmup <= self.global_steps" in source[adv:update]
    assert "_step_once" not in vars(SealPPOTrainer) and "step" not in vars(SealPPOTrainer)


def test_balance_batch_pads_with_tagged_rows_before_reordering():
    """The step rules read each row's ``is_padding`` tag (verl copies the first episode's fields,
    its SEAL record included, into padding rows)."""
    source = _source(PPOTrainer._balance_batch)
    assert _position(source, r"upsample_batch_to_divisible_size\(") < _position(source, r"batch\.reorder\(")
    assert "is_padding=True" in _source(padding_utils.construct_minimal_padding_template)
    assert "template_sample[key] = value.clone()" in _source(padding_utils.construct_minimal_padding_template)


def test_fit_dispatches_through_the_agent_loop_manager_it_is_given():
    """SEAL's ``fit`` wraps the manager (:class:`EpisodeParamsDispatch`): every dispatch, training
    or validation, must go through ``self.agent_loop_manager``."""
    fit = _source(PPOTrainer.fit)
    assert "self.agent_loop_manager = agent_loop_manager" in fit
    start = _position(fit, r"self\.agent_loop_manager = agent_loop_manager")
    step = _position(fit, r"batch = self\.step\(metrics, self\.timing_raw\)")
    save = _position(fit, r"self\._save_checkpoint\(\)")
    validate = _position(fit, r"val_metrics: dict = self\._validate\(\)")
    metrics = _position(fit, r"self\._compute_metrics\(batch")
    log = _position(fit, r"self\.logger\.log\(data=metrics")
    assert start < step < save < validate < metrics < log
    assert "self.agent_loop_manager.generate_sequences(batch)" in _source(PPOTrainer._submit_batch_to_rollout)
    assert "self._add_batch_to_generate()" in _source(PPOTrainer.prepare_step)
    module = inspect.getsource(inspect.getmodule(PPOTrainer))
    calls = re.findall(r"([\w.]+)\.generate_sequences\(", module)
    assert calls and set(calls) == {"self.agent_loop_manager"}
    # The agent loop's sampling keys read the step from the dispatched rows.
    next_batch = _source(PPOTrainer._next_train_batch)
    assert 'tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)' in next_batch


def test_validation_dispatches_with_the_validate_flag_and_dumps_the_records():
    source = _source(PPOTrainer._validate)
    assert _position(source, r'tu\.assign_non_tensor_data\(batch, "validate", True\)') < \
        _position(source, r"self\.agent_loop_manager\.generate_sequences\(batch\)")
    # The validation log receives every reward_extra_info key of the episodes (SEAL's record).
    assert 'extra_field.get("reward_extra_info", {})' in source
    assert "self._dump_generations(" in source and "reward_extra_infos_dict={" in source


def test_the_advantages_read_the_reward_tokens_and_delegate_other_estimators():
    source = _source(PPOTrainer._compute_advantage)
    assert 'data.batch["token_level_scores"] = data.batch["rm_scores"]' in source
    assert "adv_estimator=self.config.algorithm.adv_estimator" in source and "config=self.config.algorithm" in source
    helper = _source(compute_advantage_for_multi_trajectories)
    assert "if adv_estimator != core_algos.AdvantageEstimator.GRPO:\n        return compute_advantage(" in helper


def test_task_runner_v1_run_is_what_seal_task_runner_mirrors():
    verl_run = _source(_actor_method(TaskRunnerV1, "run"))
    order = [r"tq\.init\(config\.transfer_queue\)", r"self\.trainer = trainer_cls\(config=config\)",
             r"self\.trainer\.init\(\)", r"self\.init_agent_loop_manager\(\)",
             r"self\.trainer\.fit\(self\.agent_loop_manager\)", r"tracking\.finish\(", r"tq\.close\(\)"]
    positions = [_position(verl_run, p) for p in order]
    assert positions == sorted(positions)
    manager = _source(_actor_method(TaskRunnerV1, "init_agent_loop_manager"))
    assert "agent_loop_manager_cls = AgentLoopManagerTQ" in manager
    assert '.get("agent_loop_manager_class")' in manager  # a user's manager class, honoured by both runners
    for arg in ("config=self.config", "llm_client=self.trainer.get_llm_client()",
                "teacher_client=self.trainer.get_teacher_client()",
                "reward_loop_worker_handles=self.trainer.get_reward_handles()"):
        assert arg in manager, arg
    seal_run = _source(_actor_method(SealTaskRunner, "run"))
    mirrored = [r"tq\.init\(config\.transfer_queue\)", r"trainer = build_trainer\(", r"trainer\.init\(\)",
                r"manager_cls = AgentLoopManagerTQ", r"agent_loop_manager_class", r"manager_cls\.create\(",
                r"trainer\.fit\(manager\)", r"tracking\.finish\(", r"tq\.close\(\)"]
    positions = [_position(seal_run, p) for p in mirrored]
    assert positions == sorted(positions)
    assert _params(AgentLoopManagerTQ.create) == ["args", "kwargs"]


def test_run_ppo_runs_the_given_task_runner():
    assert _params(run_ppo) == ["config", "task_runner_class"]
    source = _source(run_ppo)
    assert "task_runner_class.remote()" in source and "runner.run.remote(config)" in source


def test_agent_loop_contract():
    assert _params(AgentLoopBase.run) == ["self", "sampling_params", "kwargs"]
    generate = _source(_actor_method(AgentLoopWorkerTQ, "generate_sequences"))
    # Every field of the dispatched rows (env_params and extra_info included) reaches run().
    assert "for k, v in batch.items():" in generate
    assert "session_id=i, **prompt" in _source(_actor_method(AgentLoopWorkerTQ, "_run_prompt"))
    assert "agent_loop_config_path" in inspect.getsource(AgentLoopWorker.__init__)


def test_the_agent_loop_post_processing_reads_what_seal_writes():
    """An episode's ``extra_fields`` (SEAL's record and policy versions) and its reward reach
    TransferQueue as the trainer reads them."""
    post = _source(_actor_method(AgentLoopWorkerTQ, "_agent_loop_postprocess"))
    assert '"min_global_steps": field["extra_fields"].get("min_global_steps")' in post
    assert '"max_global_steps": field["extra_fields"].get("max_global_steps")' in post
    assert 'field["loss_mask"] = field["response_mask"]' in post and "field.update(kwargs)" in post
    assert "rm_scores[-1] = reward_score" in _source(AgentLoopOutput.as_dict)


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
