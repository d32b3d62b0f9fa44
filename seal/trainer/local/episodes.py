"""Running many episodes concurrently through the episode runner, with retries on env faults.

The runner is the project's verl ``AgentLoopBase`` subclass (or anything with the same
``async run(sampling_params, **kwargs) -> AgentLoopOutput``). An episode whose environment
fails is retried ``seal.rollout.env_retries`` times, then kept as an *environment fault*: it is
logged and counted but never trained on, and never observed by the capability state. An
episode whose LLM call failed (``llm_fault``) is excluded the same way: the trainer never
trains on text the model did not write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from env_service.client import EnvUnavailableError
from seal.diagnosis.stats import extract_error_messages
from seal.rewards import RewardConfig, compute_reward
from seal.types import category_of

logger = logging.getLogger(__name__)


@dataclass
class EpisodeJob:
    """One episode to play: ``uid`` groups the ``n`` samples of one task (GRPO group)."""

    task_id: str
    uid: str
    sample: int


@dataclass
class Episode:
    """A finished (or faulted) episode, as the trainer consumes it."""

    task_id: str
    category: str
    uid: str
    sample: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    tags: list[str] | None = None
    error_messages: list[str] = field(default_factory=list)
    env_fault: bool = False
    llm_fault: bool = False
    # Left out of training and of the capability state (faults, a prompt that did not fit, ...).
    excluded: bool = False
    fault_reason: str = ""
    terminated_reason: str = ""
    num_llm_calls: int = 0
    # Response tokens played and scored but cut from the training tensors (the episode budget).
    truncated_tokens: int = 0
    attempts: int = 1
    messages: list[dict[str, Any]] = field(default_factory=list)
    check: dict[str, Any] | None = None

    @property
    def trainable(self) -> bool:
        """Played to the end by the model and with at least one model-written token."""
        return not (self.env_fault or self.llm_fault or self.excluded) and any(self.response_mask)


def episode_from_output(job: EpisodeJob, out: Any, reward_cfg: RewardConfig, *, epoch: int,
                        total_epochs: int, attempts: int) -> Episode:
    """Read an ``AgentLoopOutput`` into an :class:`Episode` and score it with ``seal.rewards``."""
    ef: Mapping[str, Any] = dict(getattr(out, "extra_fields", None) or {})
    check = ef.get("check") if isinstance(ef.get("check"), Mapping) else None
    ep = Episode(
        task_id=job.task_id,
        category=str(ef.get("category") or category_of(job.task_id)),
        uid=job.uid,
        sample=job.sample,
        prompt_ids=list(out.prompt_ids),
        response_ids=list(out.response_ids),
        response_mask=[int(m) for m in out.response_mask],
        tags=[str(t) for t in ef["tags"]] if ef.get("tags") else None,
        env_fault=bool(ef.get("env_fault")),
        llm_fault=bool(ef.get("llm_fault")),
        excluded=bool(ef.get("excluded") or ef.get("env_fault") or ef.get("llm_fault")),
        terminated_reason=str(ef.get("terminated_reason") or ""),
        num_llm_calls=int(ef.get("num_llm_calls") or 0),
        truncated_tokens=int(ef.get("truncated_response_tokens") or 0),
        attempts=int(ef.get("env_attempts") or attempts),  # the runner's own retries count here
        messages=list(ef.get("messages") or []),
        check=dict(check) if check is not None else None,
    )
    if ep.excluded:
        ep.fault_reason = str(ef.get("error") or ef.get("env_fault") or ef.get("llm_fault") or ep.terminated_reason)
        return ep
    if check is not None:
        result = compute_reward(check, cfg=reward_cfg, epoch=epoch, total_epochs=total_epochs)
        ep.reward, ep.success = float(result.score), bool(result.meta["passed"])
    elif getattr(out, "reward_score", None) is not None:
        ep.reward = float(out.reward_score)
        ep.success = ep.reward >= 1.0
    ep.error_messages = extract_error_messages(ep.messages)
    return ep


async def play_episode(runner: Any, job: EpisodeJob, sampling_params: Mapping[str, Any],
                       env_params: Mapping[str, Any], *, retries: int,
                       to_episode: Callable[[EpisodeJob, Any, int], Episode],
                       extra_info: Mapping[str, Any] | None = None) -> Episode:
    """Play ``job``, retrying up to ``retries`` more times when the environment faults.

    (The project's runner retries inside ``run`` already; the trainer passes ``retries=0``.)
    """
    reason, last = "", None
    for attempt in range(1, retries + 2):
        try:
            out = await runner.run(dict(sampling_params), task_id=job.task_id,
                                   rollout_mode=env_params.get("rollout_mode", "sample"), env_params=dict(env_params),
                                   extra_info=dict(extra_info or {}))
        except EnvUnavailableError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            logger.warning("episode %s#%d: environment unavailable (attempt %d): %s", job.task_id, job.sample,
                           attempt, exc)
            continue
        ep = to_episode(job, out, attempt)
        if not ep.env_fault:
            return ep
        reason, last = ep.fault_reason, ep
        logger.warning("episode %s#%d: environment fault (attempt %d): %s", job.task_id, job.sample, attempt, reason)
    if last is not None:
        return last
    return Episode(job.task_id, category_of(job.task_id), job.uid, job.sample, env_fault=True, excluded=True,
                   fault_reason=reason, attempts=retries + 1)


async def play_all(runner: Any, jobs: Sequence[EpisodeJob], sampling_params: Mapping[str, Any],
                   env_params_for: Callable[[EpisodeJob], Mapping[str, Any]], *, retries: int,
                   to_episode: Callable[[EpisodeJob, Any, int], Episode], max_concurrency: int,
                   desc: str, show_progress: bool = True,
                   extra_info: Mapping[str, Any] | None = None) -> list[Episode]:
    """Play every job concurrently (at most ``max_concurrency`` at once); results in job order."""
    sem = asyncio.Semaphore(max(1, max_concurrency))
    bar = tqdm(total=len(jobs), desc=desc, leave=False, disable=not show_progress)

    async def one(job: EpisodeJob) -> Episode:
        async with sem:
            ep = await play_episode(runner, job, sampling_params, env_params_for(job), retries=retries,
                                    to_episode=to_episode, extra_info=extra_info)
        bar.update(1)
        return ep

    try:
        return list(await asyncio.gather(*(one(j) for j in jobs)))
    finally:
        bar.close()
