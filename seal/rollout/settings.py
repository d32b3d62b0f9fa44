"""The episode runner's settings, read from the experiment config, and its environment client.

Config keys (``exp/seal_base.yaml``): ``seal.rollout.{max_llm_calls, max_llm_calls_per_turn,
max_env_tokens, few_shot, env_retries, max_tokens_per_call}``; verl's
``actor_rollout_ref.rollout.{prompt_length, response_length, max_model_len}`` (or
``data.max_prompt_length`` / ``data.max_response_length``); ``env_service.{url, urls, timeout_s,
bfcl}``; ``seal.reward`` and ``trainer.total_epochs`` for the reward.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

log = logging.getLogger(__name__)

# Release defaults (the SEAL recipe) for configs that lack a key, e.g. a bare verl config.
_DEFAULT_PROMPT_LENGTH = 12288
_DEFAULT_RESPONSE_LENGTH = 4096
EPISODE_BUDGETS = ("context", "response")


def _plain(node: Any) -> Any:
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg``'s value at dotted ``key`` as plain Python (``default`` when absent or null)."""
    if cfg is None:
        return default
    if isinstance(cfg, (DictConfig, ListConfig)):
        value = OmegaConf.select(cfg, key, default=None)
    else:
        value = cfg
        for part in key.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return default
            value = value[part]
    return default if value is None else _plain(value)


def _positive_int(value: Any, key: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: expected an integer >= 1{' or null' if allow_none else ''}")
    return value


@dataclass(frozen=True)
class RolloutSettings:
    """Limits and options of one episode (see ``seal.rollout`` in ``exp/seal_base.yaml``).

    ``max_llm_calls``: LLM calls per episode (release: 20, counted over the whole episode).
    ``max_llm_calls_per_turn``: optional cap per user turn (None = none).
    ``max_env_tokens``: each observation is clipped to this many tokens.
    ``few_shot``: prepend the example conversation of :mod:`seal.rollout.few_shot`.
    ``env_retries``: whole-episode retries after an environment failure.
    ``max_tokens_per_call``: new tokens per LLM call (None = ``response_length``, the release's choice).
    ``prompt_length`` / ``response_length``: verl's padded widths; the response (all turns after the
    prompt, observations included) never exceeds ``response_length``.
    ``max_model_len``: the model's context (prompt + everything generated never exceeds it).
    ``episode_budget``: what ends an episode besides the LLM-call limit. ``context`` (the
    release's rule, default): the whole raw context reaches :attr:`context_cap` =
    ``max_model_len - response_length``; the episode is scored whole and only the training
    tensors are cut to ``response_length``. ``response``: the multi-turn continuation after the
    prompt reaches ``response_length`` (nothing is cut, the episode is shorter).
    """

    max_llm_calls: int = 20
    max_llm_calls_per_turn: int | None = None
    max_env_tokens: int = 4096
    few_shot: bool = False
    env_retries: int = 1
    max_tokens_per_call: int | None = None
    prompt_length: int = _DEFAULT_PROMPT_LENGTH
    response_length: int = _DEFAULT_RESPONSE_LENGTH
    max_model_len: int = _DEFAULT_PROMPT_LENGTH + _DEFAULT_RESPONSE_LENGTH
    episode_budget: str = "context"

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
        r = "seal.rollout."
        return cls(
            max_llm_calls=select(cfg, r + "max_llm_calls", 20),
            max_llm_calls_per_turn=select(cfg, r + "max_llm_calls_per_turn"),
            max_env_tokens=select(cfg, r + "max_env_tokens", 4096),
            few_shot=select(cfg, r + "few_shot", False),
            env_retries=select(cfg, r + "env_retries", 1),
            max_tokens_per_call=select(cfg, r + "max_tokens_per_call"),
            prompt_length=int(prompt),
            response_length=int(response),
            max_model_len=int(select(cfg, "actor_rollout_ref.rollout.max_model_len") or int(prompt) + int(response)),
            episode_budget=str(select(cfg, r + "episode_budget", "context")),
        )


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in; nested mappings merge key by key, other values replace."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(_plain(value))
    return out


def episode_params(cfg: Any, rollout_mode: str, env_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``/create`` params: the environment's block (``env_service.<env>``, e.g.
    ``env_service.bfcl``) + ``rollout_mode``, then the row's ``env_params``."""
    from seal.environment import env_params_block

    base = env_params_block(cfg)
    params = deep_merge(base, {"rollout_mode": rollout_mode})
    if env_params:
        env_params = _plain(env_params)
        if not isinstance(env_params, Mapping):
            raise ValueError(f"dataset field env_params: expected a mapping, got {type(env_params).__name__}")
        params = deep_merge(params, env_params)
    return params


def make_env_client(cfg: Any, *, retries: int | None = None) -> Any:
    """An :class:`env_service.client.EnvClient` for ``env_service.urls`` / ``env_service.url``,
    or an in-process service of ``env_service.env`` when both are unset (costly per episode:
    inject a shared client). ``retries``: the HTTP client's own retries of idempotent calls
    (default: the client's; the local trainer passes 0, its runner retries whole episodes)."""
    from env_service.client import EnvClient
    from seal.environment import environment_name

    timeout = float(select(cfg, "env_service.timeout_s", 60.0))
    urls = select(cfg, "env_service.urls", []) or []
    url = select(cfg, "env_service.url")
    if not urls and not url:
        log.info("environment service: in-process")
        # seal.plugins first: one of them may register the environment (a no-op where the config
        # check imported them already, needed where only the plain config travelled).
        return EnvClient.in_process(env=environment_name(cfg), plugins=tuple(select(cfg, "seal.plugins") or ()))
    target = list(urls) if urls else str(url)
    log.info("environment service: %s", target)
    return EnvClient(target, timeout_s=timeout, **({} if retries is None else {"retries": retries}))
