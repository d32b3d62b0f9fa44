"""Running many episodes concurrently through the episode runner.

The runner is the project's verl ``AgentLoopBase`` subclass (or anything with the same
``async run(sampling_params, **kwargs) -> AgentLoopOutput``). Faults are the runner's to handle
(:mod:`seal.rollout.episode_loop`): an episode whose environment fails is played again
``seal.rollout.env_retries`` times, then kept as an *environment fault*: logged and counted but
never trained on, and never observed by the capability state. An episode whose LLM call failed
(``llm_fault``) is excluded the same way: the trainer never trains on text the model did not write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from seal.episode import EpisodeResult


@dataclass
class EpisodeJob:
    """One episode to play: ``uid`` groups the ``n`` samples of one task (GRPO group);
    ``category`` is the task store's (the record of an episode that never started keeps it)."""

    task_id: str
    uid: str
    sample: int
    category: str


def _of_result(name: str) -> property:
    return property(lambda self: getattr(self.result, name))


@dataclass
class Episode:
    """A finished (or faulted) episode, as the trainer consumes it: the runner's typed record
    (:class:`seal.episode.EpisodeResult`) plus its GRPO group and its training tensors."""

    result: EpisodeResult
    uid: str
    sample: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)

    # The record's fields the trainer reads, read-only.
    task_id = _of_result("task_id")
    reward = _of_result("reward")
    tags = _of_result("tags")
    env_fault = _of_result("env_fault")
    llm_fault = _of_result("llm_fault")

    @property
    def trainable(self) -> bool:
        """Played to the end by the model and with at least one model-written token."""
        return not self.result.excluded and any(self.response_mask)


def episode_from_output(job: EpisodeJob, out: Any) -> Episode:
    """Read an ``AgentLoopOutput`` (its ``extra_fields`` are the record's field form) into an
    :class:`Episode`. The reward is the runner's: the trainer never scores an episode again."""
    return Episode(result=EpisodeResult.from_fields(out.extra_fields), uid=job.uid, sample=job.sample,
                   prompt_ids=list(out.prompt_ids), response_ids=list(out.response_ids),
                   response_mask=[int(m) for m in out.response_mask])


async def play_episode(runner: Any, job: EpisodeJob, sampling_params: Mapping[str, Any],
                       env_params: Mapping[str, Any], *, rollout_mode: str,
                       extra_info: Mapping[str, Any] | None = None) -> Episode:
    """Play ``job`` once; the job's category reaches the runner, whose record of an episode
    that never got an instance keeps it."""
    out = await runner.run(dict(sampling_params), task_id=job.task_id, category=job.category,
                           rollout_mode=rollout_mode, env_params=dict(env_params), extra_info=dict(extra_info or {}))
    return episode_from_output(job, out)


async def play_all(runner: Any, jobs: Sequence[EpisodeJob], sampling_params: Mapping[str, Any],
                   env_params_for: Callable[[EpisodeJob], Mapping[str, Any]], *, rollout_mode: str,
                   max_concurrency: int, desc: str, show_progress: bool = True,
                   extra_info: Mapping[str, Any] | None = None) -> list[Episode]:
    """Play every job concurrently (at most ``max_concurrency`` at once); results in job order."""
    sem = asyncio.Semaphore(max(1, max_concurrency))
    bar = tqdm(total=len(jobs), desc=desc, leave=False, disable=not show_progress)

    async def one(job: EpisodeJob) -> Episode:
        async with sem:
            ep = await play_episode(runner, job, sampling_params, env_params_for(job), rollout_mode=rollout_mode,
                                    extra_info=extra_info)
        bar.update(1)
        return ep

    try:
        return list(await asyncio.gather(*(one(j) for j in jobs)))
    finally:
        bar.close()
