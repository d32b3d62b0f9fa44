"""Config preparation for Ray workers, the task dataset, the rollout inputs, the runner factory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl_testkit import make_trainer

from seal.config import REPO_ROOT, ConfigError, compose_config
from seal.trainer.verl.dataset import TaskDataset
from seal.trainer.verl.main import AGENT_LOOPS_YAML, _RunnerFactory, prepare_config, run_verl


def test_prepare_config_makes_paths_absolute_and_wires_the_workers(seal_cfg, tmp_path):
    out = prepare_config(seal_cfg, base=tmp_path, exp_dir=tmp_path / "experiments" / "SEAL")
    assert out.data.train_files == str(REPO_ROOT / "data" / "bfcl_train.parquet")  # found in the repo
    assert out.trainer.validation_data_dir == str(tmp_path / "experiments" / "SEAL" / "validation_log")
    assert out.trainer.default_local_dir == str(tmp_path / "experiments" / "SEAL" / "checkpoints")
    assert out.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(AGENT_LOOPS_YAML)
    env = out.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.PYTHONPATH.split(os.pathsep)[0] == str(REPO_ROOT)
    assert env.TENSORBOARD_DIR == str(tmp_path / "experiments" / "SEAL" / "tensorboard")
    assert "${" not in OmegaConf.to_yaml(out)  # resolved before it leaves the driver
    assert seal_cfg.data.train_files == "data/bfcl_train.parquet"  # the input is not modified
    assert out.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"  # a hub id stays as is


def test_prepare_config_defaults_the_validation_log_to_the_experiment_folder(tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["trainer.validation_data_dir=null"])
    out = prepare_config(cfg, base=tmp_path, exp_dir=tmp_path / "exp")
    assert out.trainer.validation_data_dir == str(tmp_path / "exp" / "validation_log")


def test_prepare_config_finds_a_local_model_folder(tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["actor_rollout_ref.model.path=models/SmolLM2-135M-Instruct"])
    out = prepare_config(cfg, base=tmp_path, exp_dir=tmp_path)
    if (REPO_ROOT / "models" / "SmolLM2-135M-Instruct").is_dir():
        assert out.actor_rollout_ref.model.path == str(REPO_ROOT / "models" / "SmolLM2-135M-Instruct")
    else:
        assert out.actor_rollout_ref.model.path == "models/SmolLM2-135M-Instruct"


def test_prepare_config_keeps_a_user_agent_loop_registry_and_ray_address(seal_cfg, tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["ray_kwargs.ray_init.address=ray://head:10001",
                                           f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path}/l.yaml"])
    out = prepare_config(cfg, base=tmp_path, exp_dir=tmp_path)
    assert out.ray_kwargs.ray_init.address == "ray://head:10001"
    assert out.actor_rollout_ref.rollout.agent.agent_loop_config_path == f"{tmp_path}/l.yaml"


def test_run_verl_rejects_the_local_backend(tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["trainer.backend=local"])
    with pytest.raises(ConfigError, match="trainer.backend=verl"):
        run_verl(cfg, exp_dir=tmp_path)


@pytest.mark.parametrize(("override", "fragment"), [
    ("trainer.use_v1=false", "trainer.use_v1=false: .* set trainer.use_v1=true"),
    ("trainer.v1.trainer_mode=colocate_async",
     "trainer.v1.trainer_mode=colocate_async: .* set trainer.v1.trainer_mode=sync"),
    ("trainer.critic_warmup=2", "trainer.critic_warmup=0"),
])
def test_run_verl_rejects_settings_that_skip_the_hook(tmp_path, override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        run_verl(compose_config("exp/SEAL.yaml", [override]), exp_dir=tmp_path)


@pytest.fixture
def platform_restored(monkeypatch):
    """run_verl on a machine without CUDA switches this process to the CPU platform: undone after."""
    from verl.plugin.platform import platform_manager

    monkeypatch.setattr(platform_manager, "_current_platform", platform_manager._current_platform)
    monkeypatch.setenv("VERL_PLATFORM", os.environ.get("VERL_PLATFORM", ""))


def test_run_verl_without_gpus_runs_verl_on_the_cpu_platform(tmp_path, monkeypatch, caplog, platform_restored):
    """No accelerator and a local cluster: the recipe is adapted to the CPU platform (one log line)
    and handed to verl's run_ppo, instead of refused."""
    import torch
    import verl.trainer.main_ppo

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    started = []
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda cfg, **k: started.append(cfg))
    with caplog.at_level(logging.INFO, logger="seal.trainer.verl.cpu"):
        run_verl(compose_config("exp/SEAL.yaml", ["actor_rollout_ref.model.path=models/SmolLM2-135M-Instruct"]),
                 exp_dir=tmp_path)
    (cfg,) = started
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.name == "seal_cpu"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2" and not cfg.actor_rollout_ref.ref.fsdp_config.forward_only
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_PLATFORM == "cpu" and "seal.trainer.verl.cpu_rollout" in env.VERL_USE_EXTERNAL_MODULES
    assert [r.message for r in caplog.records if "CPU platform" in r.message][0].count("\n") == 0


def test_run_verl_with_a_gpu_keeps_the_recipe(tmp_path, monkeypatch, platform_restored):
    import torch
    import verl.trainer.main_ppo
    import verl.utils.device

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(verl.utils.device, "auto_set_device", lambda cfg: None)
    started = []
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda cfg, **k: started.append(cfg))
    run_verl(compose_config("exp/SEAL.yaml", ["actor_rollout_ref.model.path=models/SmolLM2-135M-Instruct"]),
             exp_dir=tmp_path)
    (cfg,) = started
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert "VERL_PLATFORM" not in cfg.ray_kwargs.ray_init.runtime_env.env_vars


def test_run_verl_checks_a_hub_model_before_ray_starts(tmp_path, monkeypatch, platform_restored):
    """On a local cluster an unreachable hub id fails on the driver; joining a cluster leaves the
    question to the workers, whose cache and network the driver does not share."""
    import torch
    import verl.trainer.main_ppo
    import verl.utils.device

    import seal.config_base

    asked = []

    def unreachable(key, repo_id, **kwargs):
        asked.append((key, repo_id))
        raise ConfigError(f"{key}={repo_id}: not in the local hub cache and the hub is unreachable")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(seal.config_base, "check_hub_model", unreachable)
    started = []
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda *a, **k: started.append(a))
    with pytest.raises(ConfigError, match="hub is unreachable"):
        run_verl(compose_config("exp/SEAL.yaml"), exp_dir=tmp_path)
    assert asked == [("actor_rollout_ref.model.path", "Qwen/Qwen2.5-7B-Instruct")] and not started
    asked.clear()
    monkeypatch.setattr(verl.utils.device, "auto_set_device", lambda cfg: None)
    run_verl(compose_config("exp/SEAL.yaml", ["ray_kwargs.ray_init.address=auto"]), exp_dir=tmp_path)
    assert asked == [] and len(started) == 1


def test_runner_factory_keeps_options():
    factory = _RunnerFactory("/x").options(runtime_env={"nsight": {}})
    assert factory.exp_dir == "/x" and factory._options == {"runtime_env": {"nsight": {}}}


def test_task_dataset_rows(seal_cfg):
    train = TaskDataset.from_config(seal_cfg, "train")
    val = TaskDataset.from_config(seal_cfg, "val")
    assert len(train) == 400 and len(val) == 400 and not set(train.task_ids) & set(val.task_ids)
    row = train[0]
    assert row["task_id"] == row["index"] == row["extra_info"]["index"] == row["raw_prompt"][0]["content"]
    assert row["rollout_mode"] == "sample" and val[0]["rollout_mode"] == "validate"
    assert row["agent_name"] == "seal" and row["data_source"] == row["task_id"].rsplit("_", 1)[0]
    # 400 tasks / 32 per step (drop_last) = 12 steps per epoch; 6 epochs = the paper's 72 steps.
    assert len(train) // seal_cfg.data.train_batch_size * seal_cfg.trainer.total_epochs == 72


def test_task_dataset_follows_seal_tasks(seal_cfg):
    cfg = OmegaConf.merge(seal_cfg, {"seal": {"tasks": {"categories": ["multi_turn_miss_func"], "max_val_tasks": 5}}})
    val = TaskDataset.from_config(cfg, "val")
    assert len(val) == 5 and {r["data_source"] for r in (val[i] for i in range(5))} == {"multi_turn_miss_func"}
    with pytest.raises(ValueError, match="rollout_mode"):
        TaskDataset(["multi_turn_base_0"], rollout_mode="train")


class RecordingManager:
    """verl's agent-loop manager: records each dispatched batch (its workers would put the
    episodes into TransferQueue)."""

    def __init__(self) -> None:
        self.batches: list = []
        self.agent_loop_workers = ["worker-0", "worker-1"]

    def generate_sequences(self, batch) -> None:
        self.batches.append(batch)


def _dispatched(trainer, rows, *, validate=False):
    """``rows`` as verl's V1 trainer dispatches them (training: ``_next_train_batch``; validation:
    ``_validate``'s batch with its ``validate`` flag), through SEAL's dispatch; the batch the
    manager received."""
    import numpy as np
    from omegaconf import open_dict
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    from seal.trainer.verl.trainer import EpisodeParamsDispatch

    manager = RecordingManager()
    if validate:
        batch_dict = collate_fn(rows)
        batch_dict["uid"] = np.array([f"u{i}" for i in range(len(rows))], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", trainer.global_steps)
        tu.assign_non_tensor_data(batch, "validate", True)
    else:
        trainer.train_dataloader, trainer.train_dataloader_it = [collate_fn(rows)], None
        with open_dict(trainer.config):
            trainer.config.data.gen_batch_size = len(rows)
        batch = trainer._next_train_batch(len(rows))
    EpisodeParamsDispatch(manager, trainer).generate_sequences(batch)
    (sent,) = manager.batches
    return sent


def test_dispatched_rows_carry_env_params_per_mode(seal_cfg, vanilla_cfg, tmp_path):
    train = TaskDataset(["multi_turn_base_3", "multi_turn_long_context_9"], rollout_mode="sample")
    val = TaskDataset(["multi_turn_base_4"], rollout_mode="validate")
    trainer = make_trainer(seal_cfg, tmp_path, step=13, steps_per_epoch=12)
    sent = _dispatched(trainer, [train[0], train[1]])
    params = list(sent["env_params"])
    assert [p["rollout_mode"] for p in params] == ["sample", "sample"]
    assert params[0]["observation_lite"]["enable"] is True
    infos = list(sent["extra_info"])
    assert [i["epoch"] for i in infos] == [1, 1]  # step 13 is in epoch 1
    assert [i["index"] for i in infos] == ["multi_turn_base_3", "multi_turn_long_context_9"]
    assert set(sent.keys()) >= {"task_id", "rollout_mode", "agent_name", "raw_prompt", "uid", "env_params"}
    assert list(sent["task_id"]) == ["multi_turn_base_3", "multi_turn_long_context_9"]

    sent = _dispatched(trainer, [val[0]], validate=True)
    assert list(sent["env_params"])[0]["rollout_mode"] == "validate"
    assert "epoch" not in list(sent["extra_info"])[0]

    sent = _dispatched(make_trainer(vanilla_cfg, tmp_path / "v"), [train[0]])
    assert list(sent["env_params"])[0]["observation_lite"]["enable"] is False


def test_fit_hands_verl_the_dispatch(seal_cfg, tmp_path, monkeypatch):
    """``SealPPOTrainer.fit`` runs verl's ``fit`` on the manager wrapped by the dispatch that adds
    the env params; the manager's other attributes stay reachable."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from seal.trainer.verl.trainer import EpisodeParamsDispatch

    seen = []
    monkeypatch.setattr(PPOTrainer, "fit", lambda self, manager: seen.append(manager))
    manager = RecordingManager()
    make_trainer(seal_cfg, tmp_path).fit(manager)
    (dispatch,) = seen
    assert isinstance(dispatch, EpisodeParamsDispatch) and dispatch.agent_loop_workers is manager.agent_loop_workers


RESOLVE_AGENT_LOOP = """
import sys
import hydra
from omegaconf import OmegaConf
entry = OmegaConf.load(sys.argv[1])[0]
cls = hydra.utils.get_class(entry._target_)
print(entry.name, f"{cls.__module__}.{cls.__qualname__}")
"""


def test_a_worker_process_resolves_the_agent_loop_from_another_directory(seal_cfg, tmp_path):
    """A fresh interpreter with the prepared runtime env's variables, started in another
    directory, resolves the agent loop the way verl's AgentLoopWorker does (the registry file,
    then ``hydra.utils.get_class``). Inside a real Ray worker, tests/test_verl_cpu_ray.py runs it:
    its episodes are this agent loop's (``seal/observed_episodes``)."""
    import subprocess
    import sys

    out = prepare_config(seal_cfg, base=tmp_path, exp_dir=tmp_path)
    env_vars = OmegaConf.to_container(out.ray_kwargs.ray_init.runtime_env.env_vars)
    assert str(REPO_ROOT) in env_vars["PYTHONPATH"].split(os.pathsep)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **{k: str(v) for k, v in env_vars.items()}}
    done = subprocess.run([sys.executable, "-c", RESOLVE_AGENT_LOOP, out.actor_rollout_ref.rollout.agent.agent_loop_config_path],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["seal", "seal.rollout.agent_loop.SealAgentLoop"]


def test_the_task_runner_is_pinned_to_the_launching_node(monkeypatch):
    """Its experiment folder, logs and diagnosis state must land on the launching node's disk."""
    import ray

    NODE = "ab" * 28  # a node id is 28 bytes of hex

    class Context:
        def get_node_id(self) -> str:
            return NODE

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    monkeypatch.setattr(ray.util.client.ray, "is_connected", lambda: False)
    strategy = _RunnerFactory("/x").actor_options()["scheduling_strategy"]
    assert strategy.node_id == NODE and not strategy.soft
    mine = object()
    assert _RunnerFactory("/x").options(scheduling_strategy=mine).actor_options()["scheduling_strategy"] is mine


def _seal_record(task_id, valid, tags):
    import json

    from seal.episode import EpisodeResult, Evaluation

    result = EpisodeResult(task_id=task_id, category=task_id.rsplit("_", 1)[0], rollout_mode="validate",
                           evaluation=Evaluation.from_wire({"valid": valid, "failure_tags": tags}),
                           reward=float(valid), num_llm_calls=3, terminated_reason="completed",
                           messages=({"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                                     {"role": "assistant", "content": "A"}))
    return json.dumps(result.to_fields())


def test_validation_log_in_the_project_format(seal_cfg, tmp_path):
    from seal.eval.logs import read_log_dir

    trainer = make_trainer(seal_cfg, tmp_path, step=10)
    records = [_seal_record("multi_turn_base_4", True, ["pass"]),
               _seal_record("multi_turn_miss_func_9", False, ["pass", "state_mismatch"])]
    for _ in range(2):  # a repeated validation of the same step replaces the file
        trainer._dump_generations(["i", "i"], ["o", "o"], [None, None], [1.0, 0.0],
                                  {"reward": [1.0, 0.0], "seal_record": records}, str(tmp_path / "val"))
    lines = read_log_dir(tmp_path / "val")[10]
    assert [(r["task_id"], r["data_source"], r["score"], r["valid"]) for r in lines] == [
        ("multi_turn_base_4", "multi_turn_base", 1.0, True),
        ("multi_turn_miss_func_9", "multi_turn_miss_func", 0.0, False)]
    assert lines[1]["tags"] == ["pass", "state_mismatch"] and lines[0]["generation"]["temperature"] == 0
    assert lines[0]["input"] == "S\nU" and lines[0]["step"] == 10


def test_validation_log_falls_back_to_verls_dump(seal_cfg, tmp_path):
    import json

    trainer = make_trainer(seal_cfg, tmp_path, step=3)
    trainer._dump_executor = None
    trainer._init_dump_executor()
    trainer._dump_generations(["in"], ["out"], [None], [0.0], {"reward": [0.0]}, str(tmp_path / "val"))
    trainer._shutdown_dump_executor()
    line = json.loads((tmp_path / "val" / "3.jsonl").read_text())
    assert line["input"] == "in" and line["score"] == 0.0


def test_trainer_builds_as_verls_task_runner_builds_it(tmp_path):
    """``build_trainer`` constructs the trainer as verl's ``TaskRunnerV1`` does; then the first
    steps of verl's ``init()`` (tokenizer, dataloaders, worker roles and pools) run on it, up to
    where Ray workers would start."""
    model = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
    if not (model / "config.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from seal.trainer.verl.main import build_trainer
    from seal.trainer.verl.trainer import SealPPOTrainer

    cfg = prepare_config(compose_config("exp/SEAL.yaml", [f"actor_rollout_ref.model.path={model}",
                                                          "env_service.url=null"]),
                         base=tmp_path, exp_dir=tmp_path / "exp")
    trainer = build_trainer(cfg, tmp_path / "exp")
    assert isinstance(trainer, SealPPOTrainer)
    assert trainer.config.algorithm.adv_estimator == "seal_grpo" and trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer  # the sync sampler
    assert trainer.coevolution.state_dir == tmp_path / "exp" / "diagnostic_state"
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_resource_pool_mgr()
    assert len(trainer.train_dataloader) == 12 and trainer.total_training_steps == 72
    assert trainer.config.actor_rollout_ref.actor.optim.total_training_steps == 72
    assert len(trainer.val_dataloader) == 1 and len(trainer.val_dataset) == 400
    assert Role.ActorRolloutRef in trainer.role_worker_mapping  # KL loss needs the reference policy
    assert trainer.resource_pool_manager.resource_pool_spec == {"global_pool": [4]}
    first = next(iter(trainer.train_dataloader))
    assert len(first["task_id"]) == 32 and set(first["rollout_mode"]) == {"sample"}


class _Tracking:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def finish(self, exit_code: int) -> None:
        self.calls.append(("finish", exit_code))


class _Trainer:
    """What the task runner calls on the trainer it builds."""

    def __init__(self, calls: list, fail: bool) -> None:
        self.calls, self.fail, self.logger = calls, fail, _Tracking(calls)

    def init(self) -> None:
        self.calls.append("init")

    def get_llm_client(self) -> str:
        return "llm-client"

    def get_teacher_client(self) -> None:
        return None

    def get_reward_handles(self) -> list[str]:
        return ["reward-loop"]

    def fit(self, manager: object) -> None:
        self.calls.append(("fit", manager))
        if self.fail:
            raise RuntimeError("a worker died")


@pytest.mark.parametrize("fail", [False, True], ids=["done", "fit_raises"])
def test_the_task_runner_runs_verls_v1_sequence(seal_cfg, tmp_path, monkeypatch, fail):
    """``SealTaskRunner.run`` (a Ray actor's method, called here in this process): TransferQueue up,
    the trainer built and initialised, verl's ``AgentLoopManagerTQ`` on the trainer's clients,
    ``fit``, the tracker finished with the outcome and TransferQueue closed, whatever happened."""
    import copy

    import transfer_queue as tq
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ

    from seal.trainer.verl import main
    from seal.trainer.verl.main import SealTaskRunner

    calls: list = []
    monkeypatch.setattr(tq, "init", lambda conf: calls.append(("tq.init", bool(conf.enable))))
    monkeypatch.setattr(tq, "close", lambda: calls.append("tq.close"))
    monkeypatch.setattr(main, "build_trainer", lambda config, exp_dir: calls.append(("build", exp_dir))
                        or _Trainer(calls, fail))
    monkeypatch.setattr(AgentLoopManagerTQ, "create", lambda **kw: calls.append(("create", kw)) or "manager")
    runner = object.__new__(SealTaskRunner.__ray_metadata__.modified_class)
    runner.__init__(str(tmp_path))
    config = copy.deepcopy(seal_cfg)
    if fail:
        with pytest.raises(RuntimeError, match="a worker died"):
            runner.run(config)
    else:
        runner.run(config)
    assert calls[:3] == [("tq.init", True), ("build", tmp_path), "init"]
    assert calls[3] == ("create", {"config": config, "llm_client": "llm-client", "teacher_client": None,
                                   "reward_loop_worker_handles": ["reward-loop"]})
    assert calls[4:] == [("fit", "manager"), ("finish", int(fail)), "tq.close"]


class UserManager:
    """A user's agent-loop manager (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``)."""

    created: list = []

    @classmethod
    def create(cls, **kwargs):
        cls.created.append(kwargs)
        return "user-manager"


def test_the_task_runner_takes_a_users_agent_loop_manager(seal_cfg, tmp_path, monkeypatch):
    """As verl's V1 runner does, a configured manager class replaces ``AgentLoopManagerTQ``."""
    import copy

    import transfer_queue as tq
    from omegaconf import open_dict

    from seal.trainer.verl import main
    from seal.trainer.verl.main import SealTaskRunner

    calls: list = []
    monkeypatch.setattr(tq, "init", lambda conf: None)
    monkeypatch.setattr(tq, "close", lambda: None)
    monkeypatch.setattr(main, "build_trainer", lambda config, exp_dir: _Trainer(calls, False))
    config = copy.deepcopy(seal_cfg)
    with open_dict(config):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = f"{__name__}.UserManager"
    runner = object.__new__(SealTaskRunner.__ray_metadata__.modified_class)
    runner.__init__(str(tmp_path))
    runner.run(config)
    assert ("fit", "user-manager") in calls and len(UserManager.created) == 1
