"""The local trainer's episode player: an episode that never reaches the environment keeps the
category the task store gave its job, whatever its id looks like (the runner records the fault;
the player hands it the job's category)."""

from __future__ import annotations

import asyncio
from env_service.client import EnvUnavailableError
from seal.schema import default_config
from seal.trainer.local.episodes import EpisodeJob, play_episode


class _DownClient:
    """An environment client whose service is never reachable."""

    def __init__(self) -> None:
        self.creates = 0

    def create(self, task_id, params):
        self.creates += 1
        raise EnvUnavailableError("service down", code="connect")


class _NoServer:
    async def generate(self, **kwargs):
        raise AssertionError("no LLM call is made without an instance")


def test_an_unreachable_environment_gives_a_fault_with_the_task_stores_category(tokenizer):
    from seal.rollout.agent_loop import SealAgentLoop

    cfg = default_config()
    cfg.env_service.url = None
    cfg.seal.rollout.env_retries = 2
    cfg.actor_rollout_ref = {"rollout": {"prompt_length": 8192, "response_length": 2048, "max_model_len": 8192}}
    client = _DownClient()

    async def go():
        runner = SealAgentLoop.for_local(cfg, _NoServer(), tokenizer, env_client=client)
        job = EpisodeJob("pantry-restock", uid="1:pantry-restock", sample=0, category="kitchen")
        return await play_episode(runner, job, {}, {}, rollout_mode="sample")

    episode = asyncio.run(go())
    assert client.creates == 3  # the runner played it 1 + seal.rollout.env_retries times
    assert episode.env_fault and not episode.trainable
    assert episode.result.category == "kitchen"  # not a guess from the id (which has no '_<n>')
    assert episode.result.env_attempts == 3
    assert "service down" in (episode.result.error or "")
