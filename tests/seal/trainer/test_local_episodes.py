"""The local trainer's episode player: an episode that never reaches the environment keeps the
category the task store gave its job, whatever its id looks like."""

from __future__ import annotations

import asyncio

from env_service.client import EnvUnavailableError
from seal.trainer.local.episodes import EpisodeJob, episode_from_output, play_episode


class _DownRunner:
    """An episode runner whose environment is never reachable."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, sampling_params, **kwargs):
        self.calls += 1
        raise EnvUnavailableError("service down")


def test_an_unreachable_environment_gives_a_fault_with_the_task_stores_category():
    runner = _DownRunner()
    job = EpisodeJob("pantry-restock", uid="1:pantry-restock", sample=0, category="kitchen")
    episode = asyncio.run(play_episode(runner, job, {}, {}, rollout_mode="sample", retries=2,
                                       to_episode=episode_from_output))
    assert runner.calls == 3
    assert episode.env_fault and not episode.trainable
    assert episode.result.category == "kitchen"  # not a guess from the id (which has no '_<n>')
    assert episode.result.env_attempts == 3
    assert "service down" in (episode.result.error or "")
