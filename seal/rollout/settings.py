"""The episode loop's settings: ``seal.rollout.*`` plus verl's prompt, response and model lengths."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from seal.config_base import check_fields, select
from seal.schema import RolloutKeys, setting

# Release defaults (the SEAL recipe) for configs that lack a key, e.g. a bare verl config.
_DEFAULT_PROMPT_LENGTH = 12288
_DEFAULT_RESPONSE_LENGTH = 4096


def _positive_int(value: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: expected an integer >= 1")


@dataclass(frozen=True)
class RolloutSettings(RolloutKeys):
    """Limits and options of one episode: the ``seal.rollout`` fields (the schema's
    :class:`~seal.schema.RolloutKeys`, with their docs) plus verl's padded ``prompt_length`` /
    ``response_length`` and the model's context ``max_model_len``."""

    prompt_length: int = _DEFAULT_PROMPT_LENGTH
    response_length: int = _DEFAULT_RESPONSE_LENGTH
    max_model_len: int = _DEFAULT_PROMPT_LENGTH + _DEFAULT_RESPONSE_LENGTH

    def __post_init__(self) -> None:
        _positive_int(self.prompt_length, "actor_rollout_ref.rollout.prompt_length")
        _positive_int(self.response_length, "actor_rollout_ref.rollout.response_length")
        _positive_int(self.max_model_len, "actor_rollout_ref.rollout.max_model_len")
        if self.max_model_len <= self.response_length:
            raise ValueError(f"actor_rollout_ref.rollout.max_model_len={self.max_model_len}: expected an "
                             f"integer > actor_rollout_ref.rollout.response_length={self.response_length} "
                             "(the release's context cap is their difference)")
        check_fields(self, "seal.rollout")

    @property
    def per_call_tokens(self) -> int:
        return self.max_tokens_per_call or self.response_length

    @property
    def context_cap(self) -> int:
        """The release's episode budget: no LLM call once the raw context has this many tokens."""
        return self.max_model_len - self.response_length

    def room(self, context: int, continuation: int) -> int:
        """New tokens the next LLM call may write (< 1: the budget is spent); the one statement of
        ``episode_budget``. ``context``: the raw context the call would see (prompt, every turn so
        far, the pending observation); ``continuation``: its part after the initial prompt."""
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
        max_model_len = select(cfg, "actor_rollout_ref.rollout.max_model_len") or int(prompt) + int(response)
        return cls(**{f.name: setting(cfg, "seal.rollout." + f.name) for f in fields(RolloutKeys)},
                   prompt_length=int(prompt), response_length=int(response), max_model_len=int(max_model_len))
