"""The BFCL episode runner: a verl ``AgentLoopBase`` registered as ``seal_bfcl``.

One :meth:`BfclAgentLoop.run` plays one BFCL multi-turn episode against the environment service
and returns verl's :class:`AgentLoopOutput`. The same class runs under verl's ``AgentLoopManager``
(GPU backend: vLLM servers) and under the local trainer (CPU: :class:`~seal.engine.hf_server.HFServerManager`).

Token-in-token-out (see :mod:`seal.rollout.tokens`): the prompt is the chat template of
``[system, (few-shot examples), first user]``; each LLM call appends the model's own token ids
(mask 1); each observation is appended as a chat-template increment (mask 0). The text sent to the
environment is the decoded generation (special tokens dropped).

Limits: ``max_llm_calls`` per episode, an optional per-turn cap, and the episode budget
(``seal.rollout.episode_budget``; by default the release's: no LLM call once the raw context
reaches ``max_model_len - response_length``). Hitting one ends the episode and is recorded in the
episode's record (:class:`seal.episode.EpisodeResult`, ``terminated_reason``); nothing raises.
The episode is scored whole; its training tensors hold the first ``response_length`` response
tokens (the cut is counted in ``truncated_response_tokens``). Faults never reach training:

* LLM failure (the server raises or aborts): ``llm_fault=True``; the episode ends at once;
* environment failure (unavailable service, lost instance): the whole episode is retried
  ``env_retries`` times, then ``env_fault=True``.

A faulted episode has ``excluded=True``, an all-zero ``response_mask`` and reward 0, so even a
trainer that forgets to drop it cannot train on it.

``extra_fields`` is the record's field form (:meth:`~seal.episode.EpisodeResult.to_fields`), so
verl turns it into batch columns that :meth:`~seal.episode.EpisodeResult.from_fields` reads back.
Every episode (faulted ones too) also carries ``extra_fields["reward_extra_info"]`` =
``{"seal_record": <JSON of the same fields>}``, which the verl backend's validation dump
(:mod:`seal.trainer.verl.validation`) reads back.

Dataset-row kwargs read by :meth:`run`: ``task_id`` (required), ``rollout_mode`` (``sample`` for
training, ``validate`` for validation), optional ``env_params`` (merged over ``env_service.bfcl``;
the trainer delivers guideline lines this way), optional ``extra_info`` (``epoch`` for the reward's
cap decay), and any other verl fields (ignored).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, DictConfigWrap, register

from seal.episode import RECORD_KEY, EpisodeResult, Evaluation
from seal.rewards import RewardConfig, episode_reward
from seal.rollout.few_shot import with_few_shot
from seal.environment import episode_params, make_env_client
from seal.rollout.settings import RolloutSettings
from seal.config_base import select
from seal.rollout.tokens import ChatFormat, TokenTrace, clip_text
from seal.types import category_of

log = logging.getLogger(__name__)

AGENT_NAME = "seal_bfcl"
# The role of observation messages when the environment names none in its /create info: user
# messages, the release's shape for its default prompt mode (its Llama 3.1 / ToolACE modes say ipython).
OBSERVATION_ROLE = "user"

# terminated_reason values set by the runner (the environment's own reasons pass through:
# completed, max_steps_per_turn, parse_error, ...).
PROMPT_OVERFLOW = "prompt_overflow"
CONTEXT_OVERFLOW = "context_overflow"
MAX_LLM_CALLS = "max_llm_calls"
MAX_LLM_CALLS_PER_TURN = "max_llm_calls_per_turn"
LLM_ERROR = "llm_error"
ENV_ERROR = "env_error"


class EnvFault(Exception):
    """The environment failed during an episode (unavailable, lost instance, rejected request)."""


@dataclass
class _Episode:
    """Mutable state of one attempt."""

    trace: TokenTrace
    messages: list[dict]
    category: str | None = None
    observation_role: str = OBSERVATION_ROLE
    num_llm_calls: int = 0
    calls_in_turn: int = 0
    turn: Any = None
    terminated_reason: str | None = None
    llm_fault: bool = False
    error: str | None = None
    want_logprobs: bool = False
    last_generated: list[int] = field(default_factory=list)
    pending_observation: str | None = None
    clipped_observations: int = 0
    observations: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _env_errors() -> tuple[type[BaseException], ...]:
    from env_service.client import EnvError

    return (EnvError,)


@register(AGENT_NAME)
class BfclAgentLoop(AgentLoopBase):
    """verl agent loop for one BFCL episode (see the module docstring).

    Beyond verl's constructor arguments it takes, for the local trainer and tests:
    ``env_client`` (an ``EnvClient``-like object shared by many episodes; not closed here) or
    ``env_client_factory`` (a zero-argument callable; its client is closed after the episode).
    Without either, a client is built from ``env_service.*`` for each episode and closed after it.
    """

    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any = None,
                 dataset_cls: Any = None, data_config: DictConfigWrap | None = None, hf_model_type: str | None = None,
                 *, env_client: Any = None, env_client_factory: Callable[[], Any] | None = None, **kwargs: Any):
        if data_config is None:
            data_config = DictConfigWrap(OmegaConf.create(select(trainer_config.config, "data", {}) or {}))
        if hf_model_type is None:
            hf_model_type = model_type_of(select(trainer_config.config, "actor_rollout_ref.model.path"))
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config,
                         hf_model_type=hf_model_type, **kwargs)
        self.settings = RolloutSettings.from_config(self.config)
        self.reward_cfg = RewardConfig.from_dict(select(self.config, "seal.reward", {}))
        self.chat = ChatFormat.from_tokenizer(tokenizer, self.apply_chat_template_kwargs)
        self._env_client = env_client
        self._env_client_factory = env_client_factory

    @classmethod
    def for_local(cls, config: Any, server_manager: Any, tokenizer: Any, *, env_client: Any = None,
                  env_client_factory: Callable[[], Any] | None = None) -> BfclAgentLoop:
        """Build a loop outside verl's worker (local trainer, scripts, tests). Call inside the
        running event loop: verl's base class captures it."""
        cfg = config if OmegaConf.is_config(config) else OmegaConf.create(config)
        return cls(DictConfigWrap(cfg), server_manager, tokenizer, env_client=env_client,
                   env_client_factory=env_client_factory)

    # ------------------------------------------------------------------ entry point

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task_id = kwargs.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise ValueError("dataset row needs a 'task_id' (a BFCL multi-turn id such as 'multi_turn_base_0')")
        mode = str(kwargs.get("rollout_mode") or "sample")
        params = episode_params(self.config, mode, kwargs.get("env_params"))
        client, owned = self._client()
        try:
            # The task store's category, as the caller knows it (verl's dataset row: data_source).
            known_category = kwargs.get("category") or kwargs.get("data_source")
            return await self._run_with_retries(client, task_id, mode, params, dict(sampling_params),
                                                _extra_info(kwargs.get("extra_info")),
                                                str(known_category) if known_category else None)
        finally:
            if owned:
                await asyncio.to_thread(client.close)

    def _client(self) -> tuple[Any, bool]:
        if self._env_client is not None:
            return self._env_client, False
        if self._env_client_factory is not None:
            return self._env_client_factory(), True
        return make_env_client(self.config), True

    async def _run_with_retries(self, client: Any, task_id: str, mode: str, params: dict,
                                sampling_params: dict, extra_info: dict,
                                known_category: str | None) -> AgentLoopOutput:
        attempts = self.settings.env_retries + 1
        last: _Episode | None = None
        error = ""
        for attempt in range(1, attempts + 1):
            holder: list[_Episode] = []
            try:
                episode, check = await self._attempt(client, task_id, params, sampling_params, holder)
            except EnvFault as err:
                last = holder[0] if holder else None
                log.warning("environment fault on %s (attempt %d/%d): %s", task_id, attempt, attempts, err)
                error = str(err)
                continue
            return self._output(episode, check, task_id, mode, extra_info, env_fault=False, attempts=attempt)
        episode = last or _Episode(TokenTrace(list(self.chat.generation_header)), [], category=known_category,
                                   want_logprobs=_wants_logprobs(sampling_params))
        episode.terminated_reason, episode.error = ENV_ERROR, error
        log.error("episode of %s counted as an environment fault after %d attempts: %s", task_id, attempts, error)
        return self._output(episode, None, task_id, mode, extra_info, env_fault=True, attempts=attempts)

    # ------------------------------------------------------------------ one attempt

    async def _env(self, fn: Callable[..., Any], *args: Any, episode: _Episode | None = None) -> Any:
        started = time.monotonic()
        try:
            return await asyncio.to_thread(fn, *args)
        except _env_errors() as err:
            raise EnvFault(f"{getattr(fn, '__name__', 'call')}: {type(err).__name__}: {err}") from err
        finally:
            if episode is not None:
                episode.env_s += time.monotonic() - started

    async def _attempt(self, client: Any, task_id: str, params: dict, sampling_params: dict,
                       holder: list[_Episode]) -> tuple[_Episode, dict | None]:
        from env_service.client import EnvServiceError

        try:
            created = await asyncio.to_thread(client.create, task_id, params)
        except EnvServiceError as err:  # a 4xx on create is a bad task id or bad params: a config error
            raise ValueError(f"environment rejected task {task_id!r} with params from env_service.<env> / "
                             f"env_params: {err}") from err
        except _env_errors() as err:
            raise EnvFault(f"create: {type(err).__name__}: {err}") from err
        try:
            messages = with_few_shot(list(created.messages), self.settings.few_shot)
            info = created.info or {}
            episode = _Episode(TokenTrace(self.chat.prompt_ids(messages)), messages,
                               category=info.get("category"), turn=info.get("turn"),
                               observation_role=str(info.get("observation_role") or OBSERVATION_ROLE),
                               want_logprobs=_wants_logprobs(sampling_params))
            holder.append(episode)
            await self._play(client, created.instance_id, episode, sampling_params)
            check = None
            if not episode.llm_fault:
                check = await self._env(client.evaluate, created.instance_id, False, episode=episode)
            return episode, check
        finally:
            try:
                await asyncio.to_thread(client.release, created.instance_id)
            except _env_errors() as err:
                log.warning("release of %s failed: %s", created.instance_id, err)

    async def _play(self, client: Any, instance_id: str, episode: _Episode, sampling_params: dict) -> None:
        """Alternate LLM calls and environment steps until the episode ends or a limit is hit."""
        s = self.settings
        trace = episode.trace
        if len(trace.prompt_ids) > s.prompt_length or len(trace.prompt_ids) >= s.max_model_len:
            episode.terminated_reason = PROMPT_OVERFLOW
            return
        while True:
            reason = self._limit_reached(episode)
            if reason is not None:
                episode.terminated_reason = reason
                return
            increment: list[int] = []
            if episode.pending_observation is not None:
                increment = self.chat.observation_ids(episode.last_generated, episode.observation_role,
                                                      episode.pending_observation)
            room = self._room(trace, len(increment))
            if room < 1:
                episode.terminated_reason = CONTEXT_OVERFLOW
                return
            if episode.pending_observation is not None:
                trace.add_env(increment)
                episode.messages.append({"role": episode.observation_role, "content": episode.pending_observation})
                episode.pending_observation = None
                episode.observations += 1
            text = await self._generate(episode, sampling_params, min(room, s.per_call_tokens))
            if text is None:
                return
            step = await self._env(client.step, instance_id, text, episode=episode)
            if step.terminated:
                episode.terminated_reason = (step.info or {}).get("terminated_reason") or "terminated"
                return
            self._note_turn(episode, step.info or {})
            observation, clipped = clip_text(self.tokenizer, step.observation or "", s.max_env_tokens)
            episode.clipped_observations += int(clipped)
            episode.pending_observation = observation

    def _room(self, trace: TokenTrace, increment: int) -> int:
        """New tokens the next LLM call may write (< 1: the episode's budget is spent); the rule is
        :meth:`RolloutSettings.room`, over the token trace plus the pending observation."""
        return self.settings.room(len(trace) + increment, len(trace.response_ids) + increment)

    def _limit_reached(self, episode: _Episode) -> str | None:
        if episode.num_llm_calls >= self.settings.max_llm_calls:
            return MAX_LLM_CALLS
        per_turn = self.settings.max_llm_calls_per_turn
        if per_turn is not None and episode.calls_in_turn >= per_turn:
            return MAX_LLM_CALLS_PER_TURN
        return None

    @staticmethod
    def _note_turn(episode: _Episode, info: Mapping[str, Any]) -> None:
        turn = info.get("turn")
        if turn is not None and turn != episode.turn:
            episode.turn, episode.calls_in_turn = turn, 0

    async def _generate(self, episode: _Episode, sampling_params: dict, max_tokens: int) -> str | None:
        """One LLM call; appends the model's own tokens and returns their text (None on failure)."""
        params = {**sampling_params, "max_tokens": max_tokens}
        params.pop("max_new_tokens", None)
        started = time.monotonic()
        try:
            out = await self.server_manager.generate(request_id=uuid.uuid4().hex,
                                                     prompt_ids=list(episode.trace.context), sampling_params=params)
        except Exception as err:  # any server failure ends the episode as an LLM fault (never trained on)
            return self._llm_failed(episode, f"{type(err).__name__}: {err}")
        finally:
            episode.generate_s += time.monotonic() - started
        episode.num_llm_calls += 1
        episode.calls_in_turn += 1
        if out.stop_reason in ("aborted", "abort") or not out.token_ids:
            return self._llm_failed(episode, f"generation {out.stop_reason or 'empty'} after "
                                             f"{len(out.token_ids)} tokens")
        ids = [int(t) for t in out.token_ids][:max_tokens]
        logprobs = list(out.log_probs)[: len(ids)] if out.log_probs is not None else None
        if episode.want_logprobs and (logprobs is None or len(logprobs) != len(ids)):
            # verl's rollout correction needs the sampler's log-prob of every model token.
            return self._llm_failed(episode, "the server returned no log-probs for a request that asked for them "
                                             "(actor_rollout_ref.rollout.calculate_log_probs)")
        episode.trace.add_model(ids, logprobs)
        episode.last_generated = ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        episode.messages.append({"role": "assistant", "content": text})
        return text

    @staticmethod
    def _llm_failed(episode: _Episode, error: str) -> None:
        log.warning("LLM call failed; the episode is excluded from training: %s", error)
        episode.llm_fault, episode.error, episode.terminated_reason = True, error, LLM_ERROR
        return None

    # ------------------------------------------------------------------ output

    def _result(self, episode: _Episode, check: Mapping[str, Any] | None, task_id: str, mode: str,
                extra_info: Mapping[str, Any], *, env_fault: bool, attempts: int) -> EpisodeResult:
        """The episode's typed record, with its one reward (:func:`seal.rewards.episode_reward`)."""
        trace = episode.trace
        evaluation = Evaluation.from_wire(_json_safe(dict(check))) if check is not None else None
        result = EpisodeResult(
            task_id=task_id, category=_category(episode, evaluation, task_id), rollout_mode=mode,
            evaluation=evaluation, num_llm_calls=episode.num_llm_calls,
            num_prompt_tokens=len(trace.prompt_ids), num_response_tokens=int(sum(trace.response_mask)),
            truncated_response_tokens=max(0, len(trace.response_ids) - self.settings.response_length),
            clipped_observations=episode.clipped_observations, terminated_reason=episode.terminated_reason or "",
            messages=tuple(episode.messages), env_fault=env_fault, llm_fault=episode.llm_fault,
            # Nothing the model wrote (a prompt that did not fit, or no room for one token) is as
            # untrainable as a fault: excluded, so every trainer leaves it out the same way.
            excluded=(env_fault or episode.llm_fault or episode.terminated_reason == PROMPT_OVERFLOW
                      or not any(trace.response_mask)),
            error=episode.error, env_attempts=attempts)
        reward = episode_reward(result, cfg=self.reward_cfg, train=mode != "validate",
                                epoch=int(extra_info.get("epoch", 0) or 0),
                                total_epochs=int(select(self.config, "trainer.total_epochs", 1) or 1))
        return result.with_reward(reward.score, _json_safe(reward.meta))

    def _output(self, episode: _Episode, check: Mapping[str, Any] | None, task_id: str, mode: str,
                extra_info: Mapping[str, Any], *, env_fault: bool, attempts: int) -> AgentLoopOutput:
        trace = episode.trace
        result = self._result(episode, check, task_id, mode, extra_info, env_fault=env_fault, attempts=attempts)
        prompt_ids = trace.prompt_ids[-self.settings.prompt_length:]
        # The episode was played and scored whole; its training tensors hold the first
        # response_length tokens after the prompt (the release truncates the same way).
        width = self.settings.response_length
        mask = [0] * min(len(trace.response_mask), width) if result.excluded else list(trace.response_mask[:width])
        fields = result.to_fields()
        extra = dict(fields)
        # verl copies extra_fields["reward_extra_info"] into the batch as one column per key, taking
        # the keys from the batch's first episode: so every episode, faulted or not, carries the
        # same single key. The trainer's validation dump reads the record back from it.
        extra["reward_extra_info"] = {RECORD_KEY: json.dumps(fields)}
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=list(trace.response_ids[:width]), response_mask=mask,
            # One rule for every episode of a run, whatever happened to it: verl concatenates the
            # outputs of all episodes and keeps ``rollout_log_probs`` only if every one has them.
            response_logprobs=list(trace.response_logprobs[:width]) if episode.want_logprobs else None,
            reward_score=result.reward, num_turns=1 + episode.num_llm_calls + episode.observations,
            metrics={"generate_sequences": episode.generate_s, "tool_calls": episode.env_s},
            extra_fields=extra)


def _category(episode: _Episode, evaluation: Evaluation | None, task_id: str) -> str:
    """The task's category as the environment reported it (at ``/create``, else in the
    evaluation); an episode whose ``/create`` never succeeded keeps the caller's category, and
    without one the prefix of a BFCL-style id (``unknown`` for any other id)."""
    if episode.category:
        return str(episode.category)
    if evaluation is not None and evaluation.category:
        return evaluation.category
    try:
        return category_of(task_id)
    except ValueError:
        return "unknown"


def _wants_logprobs(sampling_params: Mapping[str, Any]) -> bool:
    """Whether the caller asked the server for log-probs (verl: ``rollout.calculate_log_probs``)."""
    return bool(sampling_params.get("logprobs"))


@functools.lru_cache(maxsize=8)
def model_type_of(model_path: str | None) -> str | None:
    """The ``model_type`` of a local checkpoint's ``config.json`` (None when unreadable), which
    verl's agent loop uses to pick its tokenisation builder."""
    if not model_path:
        return None
    path = os.path.join(os.path.expanduser(str(model_path)), "config.json")
    if not os.path.isfile(path):  # a hub id: its cached config.json, if any (never a download)
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model_path), "config.json")
        path = cached if isinstance(cached, str) else None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f).get("model_type")
    except (OSError, TypeError, ValueError):
        return None
    return value if isinstance(value, str) else None


class _OncePerMessage(logging.Filter):
    """Lets each distinct message through once per process: verl builds one tokenisation builder
    per episode and logs its choice every time (256 lines a step at the paper's scale)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self._seen:
            return False
        self._seen.add(message)
        return True


logging.getLogger("verl.utils.tokenizer.continuous_token_wiring").addFilter(_OncePerMessage())


def _extra_info(value: Any) -> dict:
    if value is None:
        return {}
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else {}
