"""Two real training steps of the verl backend on one GPU: Ray, FSDP, vLLM, the SEAL hooks.

Marked ``gpu``: skipped on machines without CUDA. Uses the project's small local model
(SmolLM2-135M-Instruct), four short training tasks and the in-process environment service.
"""

from __future__ import annotations

import json

import pytest

from seal.config import REPO_ROOT, compose_config

MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
TRAIN_IDS = ["multi_turn_base_100", "multi_turn_base_101", "multi_turn_base_102", "multi_turn_base_103"]
VAL_IDS = ["multi_turn_base_104", "multi_turn_base_105"]


@pytest.mark.gpu
@pytest.mark.slow
def test_two_steps_on_one_gpu(tmp_path):
    pytest.importorskip("vllm")
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from seal.trainer.verl import run_verl

    ckpt, exp_dir = tmp_path / "ckpt", tmp_path / "experiments" / "gpu_e2e"
    cfg = compose_config("exp/SEAL.yaml", [
        f"actor_rollout_ref.model.path={MODEL_DIR}",
        "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.total_epochs=1",
        "trainer.test_freq=2", "trainer.val_before_train=false", "trainer.save_freq=2",
        f"trainer.default_local_dir={ckpt}", f"trainer.validation_data_dir={exp_dir / 'validation_log'}",
        "trainer.experiment_name=gpu_e2e", "trainer.logger=[console]",
        "data.train_batch_size=2", "data.val_batch_size=2", "data.max_prompt_length=4096",
        "data.max_response_length=1024", "actor_rollout_ref.rollout.max_model_len=6144",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.agent.num_workers=1",
        f"seal.tasks.train_ids={json.dumps(TRAIN_IDS)}", f"seal.tasks.val_ids={json.dumps(VAL_IDS)}",
        "seal.rollout.max_llm_calls=4", "env_service.url=null",
    ])
    run_verl(cfg, exp_dir=exp_dir)

    assert (ckpt / "global_step_2" / "seal" / "capability_state.json").is_file()
    assert (ckpt / "global_step_2" / "actor").is_dir()
    assert (exp_dir / "diagnostic_stats" / "epoch_0.json").is_file()  # 4 tasks / 2 per step = 2 steps
    assert (exp_dir / "validation_log" / "2.jsonl").is_file()
    state = json.loads((ckpt / "global_step_2" / "seal" / "capability_state.json").read_text())
    assert state["observe_count"] > 0
