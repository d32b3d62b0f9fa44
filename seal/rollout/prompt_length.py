"""The length, in the policy's tokens, of a task's real initial prompt, and the up-front filter
that drops tasks whose prompt cannot fit (``seal.tasks.max_prompt_tokens``).

The prompt is rendered exactly as the episode runner renders it: the environment's
``[system, user]`` for the rollout mode (training episodes see the training interface, e.g.
schema hints), the few-shot example conversation when ``seal.rollout.few_shot`` is on, and the
tokenizer's chat template with the generation header (``data.apply_chat_template_kwargs``).
An episode whose prompt still overflows at run time (e.g. guideline lines added later) is
excluded from the update by the runner, so the filter is an economy, not a safety net.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from seal.rollout.few_shot import with_few_shot
from seal.environment import episode_params
from seal.rollout.settings import RolloutSettings
from seal.config_base import select
from seal.rollout.tokens import ChatFormat

logger = logging.getLogger(__name__)


def initial_prompt_renderer(cfg: Any, tokenizer: Any, env_client: Any, *, rollout_mode: str,
                            env_params: dict[str, Any] | None = None) -> Callable[[str], list[int]]:
    """A function ``task_id -> the token ids of its initial prompt`` (one ``/create`` and
    ``/release`` per call). ``env_params`` are merged over ``env_service.bfcl`` as the trainers
    do for each episode."""
    chat = ChatFormat.from_tokenizer(tokenizer, select(cfg, "data.apply_chat_template_kwargs", {}) or {})
    few_shot = RolloutSettings.from_config(cfg).few_shot
    params = episode_params(cfg, rollout_mode, env_params)

    def render(task_id: str) -> list[int]:
        created = env_client.create(task_id, params)
        try:
            return chat.prompt_ids(with_few_shot(list(created.messages), few_shot))
        finally:
            env_client.release(created.instance_id)

    return render


def prompt_token_counter(cfg: Any, tokenizer: Any, env_client: Any, *, rollout_mode: str,
                         env_params: dict[str, Any] | None = None) -> Callable[[str], int]:
    """A function ``task_id -> number of tokens of its initial prompt`` (:func:`initial_prompt_renderer`)."""
    render = initial_prompt_renderer(cfg, tokenizer, env_client, rollout_mode=rollout_mode, env_params=env_params)
    return lambda task_id: len(render(task_id))


def default_max_prompt_tokens(cfg: Any) -> int:
    """The verl backend's default for ``seal.tasks.max_prompt_tokens``: the longest prompt its
    padded batches hold (``actor_rollout_ref.rollout.prompt_length`` / ``data.max_prompt_length``),
    within ``max_model_len``."""
    s = RolloutSettings.from_config(cfg)
    return min(s.prompt_length, s.max_model_len - 1)


def fitting_tasks(task_ids: list[str], count: Callable[[str], int], max_tokens: int, *, split: str) -> list[str]:
    """``task_ids`` whose prompt has at most ``max_tokens`` tokens, in order; logs how many and
    which were dropped."""
    kept, dropped = [], {}
    for task_id in task_ids:
        n = count(task_id)
        if n <= max_tokens:
            kept.append(task_id)
        else:
            dropped[task_id] = n
    if dropped:
        shown = ", ".join(f"{t} ({n})" for t, n in list(dropped.items())[:20])
        more = f" and {len(dropped) - 20} more" if len(dropped) > 20 else ""
        logger.warning("%s: dropped %d of %d tasks whose prompt exceeds seal.tasks.max_prompt_tokens=%d tokens: %s%s",
                       split, len(dropped), len(task_ids), max_tokens, shown, more)
    else:
        logger.info("%s: all %d tasks fit seal.tasks.max_prompt_tokens=%d", split, len(task_ids), max_tokens)
    return kept
