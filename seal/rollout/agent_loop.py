"""The trainers' episode runner: a verl ``AgentLoopBase`` registered as ``seal``.

:meth:`SealAgentLoop.run` plays one episode of any environment through the one episode loop
(:mod:`seal.rollout.episode_loop`) and returns verl's :class:`AgentLoopOutput`, under verl's
``AgentLoopManager`` and under the local trainer. Its adapter, :class:`TokenGenerator`, is
token-in-token-out (:mod:`seal.rollout.tokens`): the model's own token ids (mask 1), observations
as chat-template increments (mask 0). The episode is scored whole; its training tensors hold the
first ``response_length`` response tokens. A faulted episode has ``excluded=True``, an all-zero
``response_mask`` and reward 0. ``extra_fields`` is the record's field form
(:meth:`~seal.episode.EpisodeResult.to_fields`).

Dataset-row kwargs read by :meth:`run`: ``task_id`` (required), ``rollout_mode`` (``sample`` or
``validate``), ``env_params`` (merged over ``env_service.<env>``), ``extra_info`` (``epoch``),
``category`` / ``data_source`` (kept by an episode that never got an instance).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, DictConfigWrap, register

from seal.config_base import select, to_plain
from seal.environment import episode_params, make_env_client
from seal.episode import RECORD_KEY, EpisodeResult, Evaluation
from seal.rewards import RewardConfig, episode_reward
from seal.rollout.episode_loop import PROMPT_OVERFLOW, EpisodeState, Reply, play_episode
from seal.rollout.settings import RolloutSettings
from seal.rollout.tokens import ChatFormat, TokenTrace
from seal_shared.types import category_of

log = logging.getLogger(__name__)

AGENT_NAME = "seal"


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class TokenGenerator:
    """The trainers' generation adapter (:class:`seal.rollout.episode_loop.Generator`): token ids
    through ``server_manager.generate``, kept in a :class:`TokenTrace` with the loss mask."""

    def __init__(self, server_manager: Any, tokenizer: Any, chat: ChatFormat, settings: RolloutSettings,
                 sampling_params: Mapping[str, Any], sample_key: str | None = None) -> None:
        self.server_manager, self.tokenizer, self.chat, self.settings = server_manager, tokenizer, chat, settings
        self.sampling_params = dict(sampling_params)
        # With a key, each call samples from its own seed (key, call number): the episode's tokens
        # then depend on the weights alone, not on which requests shared a batch or on any
        # process's RNG, so a resumed run or another process layout samples the same episodes.
        self.sample_key = sample_key if float(self.sampling_params.get("temperature") or 0) > 0 else None
        self.calls = 0
        # The weight versions (the trainer steps whose weights the server held) this episode's
        # calls were answered with; verl's V1 trainer reads them as the episode's policy version.
        self.versions: list[int] = []
        self.per_call_tokens = settings.per_call_tokens
        # verl's rollout correction needs the sampler's log-prob of every model token
        # (actor_rollout_ref.rollout.calculate_log_probs).
        self.want_logprobs = bool(self.sampling_params.get("logprobs"))
        # An episode whose /create failed keeps this trace: the generation header, no response.
        self.trace = TokenTrace(list(chat.generation_header))
        self.last_generated: list[int] = []
        self._increment: list[int] = []

    def start(self, messages: list[dict]) -> bool:
        self.trace = TokenTrace(self.chat.prompt_ids(messages))
        # verl's padded prompt tensor holds prompt_length tokens; a prompt filling the model's
        # whole context leaves no room to write.
        n = len(self.trace.prompt_ids)
        return n <= self.settings.prompt_length and n < self.settings.max_model_len

    def count(self, messages: list[dict], observation: dict | None) -> tuple[int, int]:
        self._increment = [] if observation is None else self.chat.observation_ids(
            self.last_generated, observation["role"], observation["content"])
        extra = len(self._increment)
        return len(self.trace) + extra, len(self.trace.response_ids) + extra

    def add_observation(self, observation: dict) -> None:
        self.trace.add_env(self._increment)

    async def generate(self, messages: list[dict], max_tokens: int) -> Reply:
        params = {**self.sampling_params, "max_tokens": max_tokens}
        params.pop("max_new_tokens", None)
        if self.sample_key is not None:
            params["seed"] = request_seed(f"{self.sample_key}:{self.calls}")
        self.calls += 1
        out = await self.server_manager.generate(request_id=uuid.uuid4().hex, prompt_ids=list(self.trace.context),
                                                 sampling_params=params)
        self.versions.extend(int(v) for v in (out.extra_fields.get("min_global_steps"),
                                              out.extra_fields.get("max_global_steps")) if v is not None)
        if out.stop_reason in ("aborted", "abort") or not out.token_ids:
            return Reply("", fault=f"generation {out.stop_reason or 'empty'} after {len(out.token_ids)} tokens")
        ids = [int(t) for t in out.token_ids][:max_tokens]
        logprobs = list(out.log_probs)[: len(ids)] if out.log_probs is not None else None
        if self.want_logprobs and (logprobs is None or len(logprobs) != len(ids)):
            return Reply("", fault="the server returned no log-probs for a request that asked for them "
                                   "(actor_rollout_ref.rollout.calculate_log_probs)")
        text = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return Reply(text, token_ids=ids, logprobs=logprobs)

    def accept(self, reply: Reply) -> None:
        self.trace.add_model(reply.token_ids, reply.logprobs)
        self.last_generated = list(reply.token_ids)


@register(AGENT_NAME)
class SealAgentLoop(AgentLoopBase):
    """verl agent loop for one episode of any environment (see the module docstring).

    Beyond verl's constructor arguments it takes, for the local trainer and tests, ``env_client``
    (an ``EnvClient``-like object shared by many episodes; not closed here). Without it, a client
    is built from ``env_service.*`` for each episode and closed after it.
    """

    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any = None,
                 dataset_cls: Any = None, data_config: DictConfigWrap | None = None, hf_model_type: str | None = None,
                 *, env_client: Any = None, **kwargs: Any):
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

    @classmethod
    def for_local(cls, config: Any, server_manager: Any, tokenizer: Any, *, env_client: Any = None) -> SealAgentLoop:
        """Build a loop outside verl's worker (local trainer, scripts, tests). Call inside the
        running event loop: verl's base class captures it."""
        cfg = config if OmegaConf.is_config(config) else OmegaConf.create(config)
        return cls(DictConfigWrap(cfg), server_manager, tokenizer, env_client=env_client)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task_id = kwargs.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise ValueError("dataset row needs a 'task_id' (a BFCL multi-turn id such as 'multi_turn_base_0')")
        mode = str(kwargs.get("rollout_mode") or "sample")
        params = episode_params(self.config, mode, kwargs.get("env_params"))
        owned = self._env_client is None
        client = make_env_client(self.config) if owned else self._env_client
        key = sample_key(select(self.config, "actor_rollout_ref.rollout.seed"), task_id, kwargs)
        try:
            state = await play_episode(
                client, task_id, params, settings=self.settings, retries=self.settings.env_retries,
                new_generator=lambda: TokenGenerator(self.server_manager, self.tokenizer, self.chat, self.settings,
                                                     sampling_params, sample_key=key))
        finally:
            if owned:
                await asyncio.to_thread(client.close)
        # The task store's category, as the caller knows it (verl's dataset row: data_source).
        known_category = kwargs.get("category") or kwargs.get("data_source")
        if not state.created:
            state.category = str(known_category) if known_category else None
        return self._output(state, task_id, mode, _extra_info(kwargs.get("extra_info")),
                            dispatched_step=kwargs.get("global_steps"))

    def _result(self, state: EpisodeState, task_id: str, mode: str, extra_info: Mapping[str, Any]) -> EpisodeResult:
        """The episode's typed record, with its one reward (:func:`seal.rewards.episode_reward`)."""
        trace = state.generator.trace
        check = state.evaluation
        evaluation = Evaluation.from_wire(_json_safe(dict(check))) if check is not None else None
        result = EpisodeResult(
            task_id=task_id, category=_category(state, evaluation, task_id), rollout_mode=mode,
            evaluation=evaluation, num_llm_calls=state.num_llm_calls,
            num_prompt_tokens=len(trace.prompt_ids), num_response_tokens=int(sum(trace.response_mask)),
            truncated_response_tokens=max(0, len(trace.response_ids) - self.settings.response_length),
            clipped_observations=state.clipped_observations, terminated_reason=state.terminated_reason or "",
            messages=tuple(state.messages), env_fault=state.env_fault, llm_fault=state.llm_fault,
            # Nothing the model wrote (a prompt that did not fit, or no room for one token) is as
            # untrainable as a fault: excluded, so every trainer leaves it out the same way.
            excluded=(state.env_fault or state.llm_fault or state.terminated_reason == PROMPT_OVERFLOW
                      or not any(trace.response_mask)),
            error=state.error, env_attempts=state.attempt, call_turns=tuple(state.call_turns))
        reward = episode_reward(result, cfg=self.reward_cfg, train=mode != "validate",
                                epoch=int(extra_info.get("epoch", 0) or 0),
                                total_epochs=int(select(self.config, "trainer.total_epochs", 1) or 1))
        return result.with_reward(reward.score, _json_safe(reward.meta))

    def _output(self, state: EpisodeState, task_id: str, mode: str, extra_info: Mapping[str, Any], *,
                dispatched_step: Any = None) -> AgentLoopOutput:
        trace = state.generator.trace
        result = self._result(state, task_id, mode, extra_info)
        prompt_ids = trace.prompt_ids[-self.settings.prompt_length:]
        # The episode was played and scored whole; its training tensors hold the first
        # response_length tokens after the prompt (the release truncates the same way).
        width = self.settings.response_length
        response_ids = list(trace.response_ids[:width])
        mask = [0] * len(response_ids) if result.excluded else list(trace.response_mask[:width])
        logprobs = list(trace.response_logprobs[:width]) if state.generator.want_logprobs else None
        if not response_ids:
            # verl places the reward on the last response token: an episode that wrote nothing
            # (it is excluded) gets one pad token with mask 0, which nothing trains on.
            response_ids, mask = [_filler_token(self.tokenizer)], [0]
            logprobs = [0.0] if logprobs is not None else None
        fields = result.to_fields()
        extra = dict(fields)
        # verl copies extra_fields["reward_extra_info"] into the batch as one column per key, taking
        # the keys from the batch's first episode: so every episode, faulted or not, carries the
        # same single key. The trainer's validation dump reads the record back from it.
        extra["reward_extra_info"] = {RECORD_KEY: json.dumps(fields)}
        extra.update(policy_versions(state.generator.versions, dispatched_step))
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask,
            # One rule for every episode of a run, whatever happened to it: verl concatenates the
            # outputs of all episodes and keeps ``rollout_log_probs`` only if every one has them.
            response_logprobs=logprobs,
            reward_score=result.reward, num_turns=1 + state.num_llm_calls + state.observations,
            metrics={"generate_sequences": state.generate_s, "tool_calls": state.env_s},
            extra_fields=extra)


def sample_key(base_seed: Any, task_id: str, row: Mapping[str, Any]) -> str | None:
    """The key of an episode's sampling seeds: (rollout seed, trainer step, task, sample index of
    its GRPO group), when the row says which step and sample it is (verl's agent-loop rows carry
    ``global_steps`` and ``session_id``); None leaves sampling to the server's own RNG."""
    step, session = row.get("global_steps"), row.get("session_id")
    if base_seed is None or step is None or session is None:
        return None
    return f"{int(base_seed)}:{int(step)}:{task_id}:{int(session)}"


def request_seed(key: str) -> int:
    """A request's sampling seed from its key: stable across processes (no ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % (2 ** 31 - 1)


def policy_versions(versions: list[int], dispatched_step: Any) -> dict[str, int]:
    """The episode's ``min_global_steps`` / ``max_global_steps``: the oldest and newest weight
    version its calls were answered with (verl's V1 trainer reads them for its staleness metrics).
    An episode that made no call reports the version a sync step samples with, the step before
    the one that dispatched it."""
    if not versions:
        fallback = max(0, int(dispatched_step) - 1) if dispatched_step is not None else 0
        versions = [fallback]
    return {"min_global_steps": min(versions), "max_global_steps": max(versions)}


def _filler_token(tokenizer: Any) -> int:
    for token in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if token is not None:
            return int(token)
    return 0


def _category(state: EpisodeState, evaluation: Evaluation | None, task_id: str) -> str:
    """The task's category as the environment reported it (at ``/create``, else in the
    evaluation); an episode whose ``/create`` never succeeded keeps the caller's category, and
    without one the prefix of a BFCL-style id (``unknown`` for any other id)."""
    if state.category:
        return str(state.category)
    if evaluation is not None and evaluation.category:
        return evaluation.category
    try:
        return category_of(task_id)
    except ValueError:
        return "unknown"


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
    value = to_plain(value)
    return dict(value) if isinstance(value, Mapping) else {}
