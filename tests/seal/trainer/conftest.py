"""Shared pieces of the trainer tests: a tiny random Llama, a scripted episode runner, configs.

The scripted runner stands in for the project's episode runner where a test is about the
trainer's own logic (advantages, update, resume, faults): its tokens, rewards and tags come from
torch's global RNG, so a run is reproducible exactly when the trainer restores that RNG.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from seal.config import REPO_ROOT, compose_config
from seal.episode import EpisodeResult, Evaluation
from seal.rewards import RewardConfig, episode_reward
from seal_shared.types import FailureTag

FAILURE_TAGS = [FailureTag.STATE_MISMATCH, FailureTag.SPURIOUS_TOOL_CALL, FailureTag.INSTANCE_MISMATCH,
                FailureTag.RESPONSE_MISMATCH]
TRAIN_IDS = ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_3", "multi_turn_miss_param_4"]
VAL_IDS = ["multi_turn_base_10", "multi_turn_long_context_11"]


def tiny_llama(tokenizer: Any, seed: int = 0) -> torch.nn.Module:
    """2 layers, hidden 64, SmolLM2's vocabulary; random weights from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 2
    return model


@pytest.fixture
def make_model(tokenizer):
    return lambda seed=0: tiny_llama(tokenizer, seed)


class ScriptedRunner:
    """An episode runner with verl's ``run`` contract that plays no real environment.

    Each episode: a short prompt, two "assistant" chunks of random tokens (mask 1) around an
    "observation" chunk (mask 0), alternating pass/fail per task and random failure tags. ``faults``:
    task id -> number of leading attempts that report an environment fault (-1: always).
    """

    def __init__(self, tokenizer: Any, faults: dict[str, int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.faults = dict(faults or {})
        self.attempts: dict[str, int] = {}
        self.calls: list[dict[str, Any]] = []

    def _prompt(self, task_id: str) -> list[int]:
        msgs = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": f"Do {task_id}."}]
        out = self.tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    async def run(self, sampling_params: dict, *, task_id: str, rollout_mode: str, env_params: dict,
                  **kwargs: Any) -> Any:
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        self.calls.append({"task_id": task_id, "rollout_mode": rollout_mode, "env_params": env_params,
                           "sampling_params": sampling_params})
        n = self.attempts[task_id] = self.attempts.get(task_id, 0) + 1
        limit = self.faults.get(task_id, 0)
        fault = limit < 0 or n <= limit
        a1 = torch.randint(100, 1000, (int(torch.randint(3, 8, ())),)).tolist()
        obs = self.tokenizer.encode("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")
        a2 = torch.randint(100, 1000, (int(torch.randint(2, 6, ())),)).tolist() + [2]
        # Alternate pass/fail per task, so every GRPO group of two has a non-zero advantage.
        passed = n % 2 == 1
        tags = [str(FailureTag.PASS)] * 2 if passed else [
            str(FAILURE_TAGS[int(torch.randint(0, len(FAILURE_TAGS), ()))]) for _ in range(2)]
        check = {"valid": passed, "accuracy": float(passed), "failure_tags": tags,
                 "error_type": None if passed else "multi_turn:instance_state_mismatch"}
        result = scored(EpisodeResult(
            task_id=task_id, category=task_id.rsplit("_", 1)[0], rollout_mode=rollout_mode,
            evaluation=Evaluation.from_wire(check), num_llm_calls=2,
            num_response_tokens=len(a1) + len(a2), terminated_reason="completed",
            env_fault=fault, error="EnvUnavailableError: service down" if fault else None,
            messages=({"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": "a"},
                      {"role": "user", "content": "[ERROR] Invalid tool call format: x"})))
        extra = result.to_fields()
        return AgentLoopOutput(prompt_ids=self._prompt(task_id), response_ids=a1 + obs + a2,
                               response_mask=[1] * len(a1) + [0] * len(obs) + [1] * len(a2), num_turns=4,
                               metrics=AgentLoopMetrics(), extra_fields=extra)


def scored(result: EpisodeResult, **changes: Any) -> EpisodeResult:
    """``result`` with ``changes`` applied and its reward recomputed, as the episode runner scores
    it (the quickstart's binary reward; validation episodes score the verdict)."""
    result = dataclasses.replace(result, **changes)
    reward = episode_reward(result, cfg=RewardConfig(), train=result.rollout_mode != "validate")
    return result.with_reward(reward.score, reward.meta)


def with_verdict(out: Any, *, valid: bool | None = None, tags: list[str] | None = None) -> Any:
    """Change a scripted episode's verdict (and so its reward) in ``out.extra_fields``."""
    result = EpisodeResult.from_fields(out.extra_fields)
    wire = result.evaluation.to_wire()
    if valid is not None:
        wire.update(valid=valid, accuracy=float(valid))
    if tags is not None:
        wire["failure_tags"] = list(tags)
    out.extra_fields = scored(result, evaluation=Evaluation.from_wire(wire)).to_fields()
    return out


ScriptedRunner.with_verdict = staticmethod(with_verdict)


class NoEnv:
    """The trainer's environment client is not used by the scripted runner."""

    def close(self) -> None:  # pragma: no cover - nothing to close
        pass


def trainer_cfg(name: str = "t", extra: list[str] | None = None):
    """The quickstart config for tests: 4 training tasks, 2 per step, n=2, no tensorboard."""
    overrides = [
        f"trainer.experiment_name={name}",
        f"seal.tasks.train_ids=[{','.join(TRAIN_IDS)}]",
        f"seal.tasks.val_ids=[{','.join(VAL_IDS)}]",
        "seal.tasks.max_prompt_tokens=null",
        "seal.local.tensorboard=false",
        "seal.local.progress_bars=false",
        # The scripted runner's validation draws from the RNG: not a policy's greedy pass to cache.
        "seal.local.validation_cache=false",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "trainer.total_training_steps=2",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.test_freq=2",
        "trainer.save_freq=1",
    ]
    return compose_config(REPO_ROOT / "exp" / "quickstart_bfcl.yaml", overrides + list(extra or []))


@pytest.fixture
def scripted_runner(tokenizer):
    """``scripted_runner(faults=None)`` -> a :class:`ScriptedRunner` on SmolLM2's tokenizer."""
    return lambda faults=None: ScriptedRunner(tokenizer, faults)


@pytest.fixture
def trainer_config():
    return trainer_cfg


@pytest.fixture
def make_trainer(tokenizer, make_model):
    """Build a :class:`LocalTrainer` on the tiny model and the scripted runner."""
    from seal.trainer.local import LocalTrainer

    def build(exp_dir: Path, *, extra: list[str] | None = None, runner: ScriptedRunner | None = None,
              env: Any = None):
        runner = runner or ScriptedRunner(tokenizer)
        cfg = trainer_cfg(exp_dir.name, extra)
        trainer = LocalTrainer(cfg, exp_dir, runner_factory=lambda *_: runner, env_client=env or NoEnv(),
                               model=make_model(), tokenizer=tokenizer)
        return trainer, runner

    return build

