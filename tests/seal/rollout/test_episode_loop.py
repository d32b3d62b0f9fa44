"""The one episode loop: training (the trainers' ``SealAgentLoop``) and ``seal eval``
(``evaluate_episode``) play every episode through :mod:`seal.rollout.episode_loop`, so a rule
changed there is seen by both."""

from __future__ import annotations

import asyncio
from typing import Any

from seal.eval.evaluate import evaluate_episode
from seal.eval.policies import SamplingSettings
from seal.rollout import episode_loop
from seal.rollout.settings import RolloutSettings
from test_rollout_agent_loop import CALL_STOCK, SAMPLING, TASK, make_config


class _LoopingPolicy:
    """``seal eval``'s side: a chat policy that always calls the same tool."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: list[dict], sampling: Any) -> str:
        self.calls += 1
        return CALL_STOCK


def _train_episode(cfg: Any, server: Any, tokenizer: Any, client: Any) -> dict:
    from seal.rollout.agent_loop import SealAgentLoop

    async def go() -> Any:
        loop = SealAgentLoop.for_local(cfg, server, tokenizer, env_client=client)
        return await loop.run(dict(SAMPLING), task_id=TASK, rollout_mode="validate")

    return asyncio.run(go()).extra_fields


def test_a_rule_changed_in_the_loop_is_seen_by_training_and_seal_eval(monkeypatch, scripted_server, tokenizer,
                                                                       env_client) -> None:
    def stop_after_two_calls(state: Any, settings: Any) -> str | None:
        return "stopped_by_test" if state.num_llm_calls >= 2 else None

    monkeypatch.setattr(episode_loop, "_limit_reached", stop_after_two_calls)
    trained = _train_episode(make_config(), scripted_server([], default=CALL_STOCK), tokenizer, env_client)
    policy = _LoopingPolicy()
    evaluated = evaluate_episode(env_client, policy, TASK, params={"rollout_mode": "validate"},
                                 sampling=SamplingSettings())
    assert (trained["terminated_reason"], trained["num_llm_calls"]) == ("stopped_by_test", 2)
    assert (evaluated.terminated_reason, evaluated.num_llm_calls, policy.calls) == ("stopped_by_test", 2, 2)


def test_seal_eval_applies_the_per_turn_cap_the_trainers_apply(scripted_server, tokenizer, env_client) -> None:
    # The per-turn cap is a rule of the loop: seal eval stops where the trainers stop.
    trained = _train_episode(make_config(max_llm_calls_per_turn=3), scripted_server([], default=CALL_STOCK),
                             tokenizer, env_client)
    evaluated = evaluate_episode(env_client, _LoopingPolicy(), TASK, params={"rollout_mode": "validate"},
                                 sampling=SamplingSettings(), budget=RolloutSettings(max_llm_calls_per_turn=3))
    assert trained["terminated_reason"] == evaluated.terminated_reason == episode_loop.MAX_LLM_CALLS_PER_TURN
    assert trained["num_llm_calls"] == evaluated.num_llm_calls == 3
