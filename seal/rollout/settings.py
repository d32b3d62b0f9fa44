"""The episode runner's settings, read from the experiment config.

Config keys: ``seal.rollout.*`` (:class:`seal.schema.RolloutKeys`, which holds each default and
doc); verl's ``actor_rollout_ref.rollout.{prompt_length, response_length, max_model_len}`` (or
``data.max_prompt_length`` / ``data.max_response_length``). The environment's side (the ``/create``
params, the client) is :mod:`seal.environment`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seal.config_base import select
from seal.schema import schema_default, setting

# Release defaults (the SEAL recipe) for configs that lack a key, e.g. a bare verl config.
_DEFAULT_PROMPT_LENGTH = 12288
_DEFAULT_RESPONSE_LENGTH = 4096
EPISODE_BUDGETS = ("context", "response")
_R = "seal.rollout."


def _positive_int(value: Any, key: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: expected an integer >= 1{' or null' if allow_none else ''}")
    return value


@dataclass(frozen=True)
class RolloutSettings:
    """Limits and options of one episode. The ``seal.rollout`` fields, their defaults and docs are
    the schema's (:class:`seal.schema.RolloutKeys`); a field's default here is read from it.

    ``prompt_length`` / ``response_length``: verl's padded widths; the response (all turns after the
    prompt, observations included) never exceeds ``response_length``.
    ``max_model_len``: the model's context (prompt + everything generated never exceeds it).
    ``episode_budget``: what ends an episode besides the LLM-call limit. ``context`` (the
    release's rule, default): the whole raw context reaches :attr:`context_cap` =
    ``max_model_len - response_length``; the episode is scored whole and only the training
    tensors are cut to ``response_length``. ``response``: the multi-turn continuation after the
    prompt reaches ``response_length`` (nothing is cut, the episode is shorter).
    """

    max_llm_calls: int = schema_default(_R + "max_llm_calls")
    max_llm_calls_per_turn: int | None = schema_default(_R + "max_llm_calls_per_turn")
    max_env_tokens: int = schema_default(_R + "max_env_tokens")
    few_shot: bool = schema_default(_R + "few_shot")
    env_retries: int = schema_default(_R + "env_retries")
    max_tokens_per_call: int | None = schema_default(_R + "max_tokens_per_call")
    prompt_length: int = _DEFAULT_PROMPT_LENGTH
    response_length: int = _DEFAULT_RESPONSE_LENGTH
    max_model_len: int = _DEFAULT_PROMPT_LENGTH + _DEFAULT_RESPONSE_LENGTH
    episode_budget: str = schema_default(_R + "episode_budget")

    def __post_init__(self) -> None:
        if self.episode_budget not in EPISODE_BUDGETS:
            raise ValueError(f"seal.rollout.episode_budget={self.episode_budget!r}: choose one of {list(EPISODE_BUDGETS)}")
        if self.max_model_len <= self.response_length:
            raise ValueError(f"actor_rollout_ref.rollout.max_model_len={self.max_model_len} must exceed "
                             f"response_length={self.response_length} (the release's context cap is their difference)")
        _positive_int(self.max_llm_calls, "seal.rollout.max_llm_calls")
        _positive_int(self.max_llm_calls_per_turn, "seal.rollout.max_llm_calls_per_turn", allow_none=True)
        _positive_int(self.max_env_tokens, "seal.rollout.max_env_tokens")
        _positive_int(self.max_tokens_per_call, "seal.rollout.max_tokens_per_call", allow_none=True)
        _positive_int(self.prompt_length, "actor_rollout_ref.rollout.prompt_length")
        _positive_int(self.response_length, "actor_rollout_ref.rollout.response_length")
        _positive_int(self.max_model_len, "actor_rollout_ref.rollout.max_model_len")
        if isinstance(self.env_retries, bool) or not isinstance(self.env_retries, int) or self.env_retries < 0:
            raise ValueError(f"seal.rollout.env_retries={self.env_retries!r}: expected an integer >= 0")
        if not isinstance(self.few_shot, bool):
            raise ValueError(f"seal.rollout.few_shot={self.few_shot!r}: expected true or false")

    @property
    def per_call_tokens(self) -> int:
        return self.max_tokens_per_call or self.response_length

    @property
    def context_cap(self) -> int:
        """The release's episode budget: no LLM call once the raw context has this many tokens."""
        return self.max_model_len - self.response_length

    def room(self, context: int, continuation: int) -> int:
        """New tokens the next LLM call may write; < 1 means the episode's budget is spent.

        The one statement of the episode budget, for the trainers' episode runner and ``seal eval``.
        ``context``: the raw context the call would see (prompt, every turn so far, the pending
        observation); ``continuation``: its part after the initial prompt. ``context`` budget (the
        release's): no call once ``context`` reaches :attr:`context_cap`, and a call writes at most
        up to ``max_model_len``. ``response`` budget: the continuation stays within ``response_length``.
        """
        if self.episode_budget == "context":
            return 0 if context >= self.context_cap else self.max_model_len - context
        return min(self.response_length - continuation, self.max_model_len - context)

    @classmethod
    def from_config(cls, cfg: Any) -> RolloutSettings:
        """Settings from a composed experiment config (DictConfig or nested dict)."""
        prompt = select(cfg, "actor_rollout_ref.rollout.prompt_length") or select(
            cfg, "data.max_prompt_length", _DEFAULT_PROMPT_LENGTH)
        response = select(cfg, "actor_rollout_ref.rollout.response_length") or select(
            cfg, "data.max_response_length", _DEFAULT_RESPONSE_LENGTH)
        keys = ("max_llm_calls", "max_llm_calls_per_turn", "max_env_tokens", "few_shot", "env_retries",
                "max_tokens_per_call", "episode_budget")
        return cls(
            **{k: setting(cfg, _R + k) for k in keys},
            prompt_length=int(prompt),
            response_length=int(response),
            max_model_len=int(select(cfg, "actor_rollout_ref.rollout.max_model_len") or int(prompt) + int(response)),
        )
