"""The one episode loop: every rule of playing an episode, for training, validation and ``seal eval``.

:func:`play_episode` creates an instance, alternates LLM calls and environment steps, evaluates
and releases; a :class:`Generator` adapter generates the replies (token ids for the trainers,
:class:`seal.rollout.agent_loop.TokenGenerator`; chat text for ``seal eval``,
:class:`seal.eval.policies.ChatGenerator`). The rules (prompt overflow, the LLM-call limits, the
episode budget :meth:`RolloutSettings.room`, observation clipping, faults and retries) are in
:func:`_play` and :func:`play_attempt`, in that order; docs/architecture.md describes them. Each
caller turns the returned :class:`EpisodeState` into its own record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from env_service.client import EnvError, EnvServiceError
from seal.rollout.few_shot import with_few_shot
from seal.rollout.settings import RolloutSettings
from seal.rollout.tokens import clip_text

log = logging.getLogger(__name__)

# The role of observation messages when the environment names none in its /create info: user
# messages, the release's shape for its default prompt mode (its Llama 3.1 / ToolACE modes say ipython).
OBSERVATION_ROLE = "user"

# terminated_reason values set by the loop (the environment's own reasons pass through:
# completed, max_steps_per_turn, parse_error, ...).
PROMPT_OVERFLOW = "prompt_overflow"
CONTEXT_OVERFLOW = "context_overflow"
MAX_LLM_CALLS = "max_llm_calls"
MAX_LLM_CALLS_PER_TURN = "max_llm_calls_per_turn"
LLM_ERROR = "llm_error"
ENV_ERROR = "env_error"


class TaskRejected(ValueError):
    """The environment answered ``/create`` with a client error: a bad task id or bad params."""


class ContextFull(Exception):
    """Raised by a generator whose server says the conversation no longer fits the model."""


@dataclass(frozen=True)
class Reply:
    """One LLM call's answer. ``fault``: why it cannot be used (aborted, empty, no log-probs);
    ``*_tokens``: the server's counts (0: none reported); ``token_ids``/``logprobs``: the model's own."""

    text: str
    fault: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


class Generator(Protocol):
    """The generation adapter of one attempt. ``per_call_tokens``: most new tokens of a call;
    ``tokenizer``: clips observations (None: unclipped)."""

    per_call_tokens: int
    tokenizer: Any

    def start(self, messages: list[dict]) -> bool:
        """Take the initial prompt; False when it is too long to play."""

    def count(self, messages: list[dict], observation: dict | None) -> tuple[int, int] | None:
        """``(context, continuation after the prompt)`` tokens the next call would see with
        ``observation`` added; None when it cannot count before a call."""

    def add_observation(self, observation: dict) -> None:
        """Append the observation :meth:`count` last saw."""

    async def generate(self, messages: list[dict], max_tokens: int) -> Reply:
        """One LLM call; raises on a server failure."""

    def accept(self, reply: Reply) -> None:
        """Append a reply the loop kept."""


@dataclass
class EpisodeState:
    """What one attempt gathered. ``unseen_observation``: the last observation, which the model
    never saw (the episode ended first); ``fault``: the exception behind an LLM or environment
    fault; ``env_terminated``: the environment ended the episode (``terminated_reason`` is its)."""

    generator: Any
    attempt: int = 1
    created: bool = False
    messages: list[dict] = field(default_factory=list)
    category: str | None = None
    observation_role: str = OBSERVATION_ROLE
    num_llm_calls: int = 0
    calls_in_turn: int = 0
    turn: Any = None
    call_turns: list[Any] = field(default_factory=list)
    terminated_reason: str | None = None
    env_terminated: bool = False
    llm_fault: bool = False
    env_fault: bool = False
    error: str | None = None
    fault: BaseException | None = None
    unseen_observation: dict | None = None
    clipped_observations: int = 0
    observations: int = 0
    evaluation: Any = None
    generate_s: float = 0.0
    env_s: float = 0.0


async def play_episode(client: Any, task_id: str, params: dict, new_generator: Callable[[], Any],
                       settings: RolloutSettings, *, retries: int = 0) -> EpisodeState:
    """Play ``task_id`` (``params``: the ``/create`` params); an environment fault plays the whole
    episode again, up to ``retries`` more times. Returns the last attempt's state."""
    attempts = retries + 1
    for attempt in range(1, attempts + 1):
        state = EpisodeState(new_generator(), attempt=attempt)
        await play_attempt(state, client, task_id, params, settings)
        if not state.env_fault:
            return state
        log.warning("environment fault on %s (attempt %d/%d): %s", task_id, attempt, attempts, state.error)
    state.terminated_reason = ENV_ERROR
    log.error("episode of %s counted as an environment fault after %d attempts: %s", task_id, attempts, state.error)
    return state


async def play_attempt(state: EpisodeState, client: Any, task_id: str, params: dict,
                       settings: RolloutSettings) -> None:
    """One attempt into ``state``: create, play, evaluate (unless faulted), release. Raises only
    :class:`TaskRejected` and what is neither an LLM nor an environment failure (a bug)."""
    try:
        created = await asyncio.to_thread(client.create, task_id, params)
    except EnvServiceError as err:  # a 4xx on create is a bad task id or bad params: a config error
        raise TaskRejected(f"environment rejected task {task_id!r} with params from env_service.<env> / "
                           f"env_params: {err}") from err
    except EnvError as err:
        _env_failed(state, "create", err)
        return
    state.created, instance_id, info = True, created.instance_id, created.info or {}
    try:
        state.messages = with_few_shot([dict(m) for m in created.messages], settings.few_shot)
        state.category = info.get("category")
        state.turn = info.get("turn")
        state.observation_role = str(info.get("observation_role") or OBSERVATION_ROLE)
        await _play(state, client, instance_id, settings)
        if not (state.llm_fault or state.env_fault):
            state.evaluation = await _env(state, "evaluate", client.evaluate, instance_id, False)
    except EnvError:  # recorded by _env as the attempt's environment fault
        return
    finally:
        await asyncio.to_thread(release, client, instance_id)


async def _env(state: EpisodeState, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """An environment call in a worker thread; its failure is the attempt's environment fault."""
    started = time.monotonic()
    try:
        return await asyncio.to_thread(fn, *args)
    except EnvError as err:
        _env_failed(state, name, err)
        raise
    finally:
        state.env_s += time.monotonic() - started


def _env_failed(state: EpisodeState, name: str, err: BaseException) -> None:
    state.env_fault, state.fault = True, err
    state.error = f"{name}: {type(err).__name__}: {err}"


async def _play(state: EpisodeState, client: Any, instance_id: str, s: RolloutSettings) -> None:
    """Alternate LLM calls and environment steps until the episode ends or a limit is hit."""
    gen = state.generator
    if not gen.start(state.messages):
        state.terminated_reason = PROMPT_OVERFLOW
        return
    pending: dict | None = None
    reported_prompt: int | None = None
    while True:
        reason, counted, room = _limit_reached(state, s), None, None
        if reason is None:
            counted = gen.count(state.messages, pending)
            room = s.room(*counted) if counted is not None else None
            if room is not None and room < 1:
                reason = CONTEXT_OVERFLOW
        if reason is not None:
            state.terminated_reason, state.unseen_observation = reason, pending
            return
        if pending is not None:
            gen.add_observation(pending)
            state.messages.append(pending)
            state.observations += 1
            pending = None
        reply = await _generate(state, min(room, gen.per_call_tokens) if room is not None else gen.per_call_tokens)
        if reply is None:
            return
        if counted is None and reply.prompt_tokens:
            # Counted only by the server: a call the budget would not have allowed is discarded.
            reported_prompt = reported_prompt or reply.prompt_tokens
            if s.room(reply.prompt_tokens, reply.prompt_tokens - reported_prompt) < 1:
                state.terminated_reason = CONTEXT_OVERFLOW
                return
        state.num_llm_calls += 1
        state.calls_in_turn += 1
        if reply.fault is not None:
            _llm_failed(state, reply.fault)
            return
        gen.accept(reply)
        state.call_turns.append(state.turn if isinstance(state.turn, int) else None)
        state.messages.append({"role": "assistant", "content": reply.text})
        step = await _env(state, "step", client.step, instance_id, reply.text)
        info = step.info or {}
        if step.terminated:
            state.terminated_reason = info.get("terminated_reason") or "terminated"
            state.env_terminated = True
            state.unseen_observation = _observation(state, step.observation or "", s)[0]
            return
        turn = info.get("turn")
        if turn is not None and turn != state.turn:
            state.turn, state.calls_in_turn = turn, 0
        pending, clipped = _observation(state, step.observation or "", s)
        state.clipped_observations += int(clipped)


def _limit_reached(state: EpisodeState, s: RolloutSettings) -> str | None:
    if state.num_llm_calls >= s.max_llm_calls:
        return MAX_LLM_CALLS
    if s.max_llm_calls_per_turn is not None and state.calls_in_turn >= s.max_llm_calls_per_turn:
        return MAX_LLM_CALLS_PER_TURN
    return None


def _observation(state: EpisodeState, text: str, s: RolloutSettings) -> tuple[dict, bool]:
    """The observation message, clipped to ``max_env_tokens`` where the generator can count."""
    clipped = False
    if state.generator.tokenizer is not None:
        text, clipped = clip_text(state.generator.tokenizer, text, s.max_env_tokens)
    return {"role": state.observation_role, "content": text}, clipped


async def _generate(state: EpisodeState, max_tokens: int) -> Reply | None:
    """One LLM call (None: it failed, or the server said the context is full)."""
    started = time.monotonic()
    try:
        return await state.generator.generate(state.messages, max_tokens)
    except ContextFull as err:
        log.info("stopping an episode: %s", err)
        state.terminated_reason = CONTEXT_OVERFLOW
    except Exception as err:  # any server failure ends the episode as an LLM fault (never trained on)
        state.fault = err
        _llm_failed(state, f"{type(err).__name__}: {err}")
    finally:
        state.generate_s += time.monotonic() - started
    return None


def _llm_failed(state: EpisodeState, error: str) -> None:
    log.warning("LLM call failed; the episode ends unevaluated (never trained on): %s", error)
    state.llm_fault, state.error, state.terminated_reason = True, error, LLM_ERROR


def release(client: Any, instance_id: str) -> None:
    """Release an instance; a failure is logged (the episode's result stands, and a leaked
    instance is the service's to reap)."""
    try:
        client.release(instance_id)
    except Exception:  # whatever went wrong, the episode is over: never lose its result to it
        log.warning("release of instance %s failed", instance_id, exc_info=True)
