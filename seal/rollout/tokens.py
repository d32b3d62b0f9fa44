"""Token-level bookkeeping of a multi-turn episode: chat-template increments and the loss mask.

An episode's token stream is built by appending, never by re-tokenising what is already there:

* the prompt is the chat template of ``[system, (few-shot...), user]`` with the generation header;
* each LLM call appends the model's **own** token ids (loss mask 1, including its end-of-message
  token);
* before the next call, the tokens that close the assistant message and open the next one are
  appended with mask 0: the rest of the template's assistant closing (``\\n`` after ``<|im_end|>``
  for ChatML, or the whole closing when the model was cut off), the observation message, and the
  next generation header.

Every piece of template text is found by rendering small dummy conversations and diffing them, so
nothing here spells a particular chat format; :class:`ChatFormat` checks that the template is
append-only (each rendering extends the previous one) and fails with a clear message otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Dummy conversation used to find the template's increments. Single characters keep the
# surrounding template text from merging with the content during tokenisation.
_DUMMY_PREFIX: tuple[dict[str, str], ...] = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
_DUMMY_ASSISTANT = "A"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used incrementally (it rewrites earlier turns)."""


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
           chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The chat-template text of ``messages`` (only ``role`` and ``content`` are passed on)."""
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **dict(chat_template_kwargs or {}))


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text; special tokens are already spelled in it, so none are added."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def _strip_prefix(full: list[int], prefix: list[int], what: str) -> list[int]:
    if full[: len(prefix)] != prefix:
        raise ChatTemplateError(
            f"chat template is not append-only ({what}): rendering one more message changed the tokens "
            "of the earlier ones; use a template that renders each message independently (e.g. ChatML)")
    return full[len(prefix):]


@dataclass(frozen=True)
class ChatFormat:
    """Template increments of one tokenizer, computed once by diffing dummy renderings.

    ``generation_header``: tokens that open an assistant message (``<|im_start|>assistant\\n``).
    ``assistant_close``: tokens the template puts after an assistant message's content
    (``<|im_end|>\\n``). The model's generation normally ends with a prefix of it (its EOS).
    """

    tokenizer: Any = field(repr=False, compare=False)
    generation_header: tuple[int, ...]
    assistant_close: tuple[int, ...]
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> ChatFormat:
        kw = dict(chat_template_kwargs or {})
        prefix = list(_DUMMY_PREFIX)
        base = encode(tokenizer, render(tokenizer, prefix, add_generation_prompt=False, chat_template_kwargs=kw))
        opened = encode(tokenizer, render(tokenizer, prefix, add_generation_prompt=True, chat_template_kwargs=kw))
        header = _strip_prefix(opened, base, "generation prompt")
        closed = encode(tokenizer, render(tokenizer, [*prefix, {"role": "assistant", "content": _DUMMY_ASSISTANT}],
                                          add_generation_prompt=False, chat_template_kwargs=kw))
        body = _strip_prefix(closed, opened, "assistant message")
        content = encode(tokenizer, _DUMMY_ASSISTANT)
        if body[: len(content)] != content:
            raise ChatTemplateError("chat template changes the assistant's content; cannot keep the model's own tokens")
        if not header:
            raise ChatTemplateError("chat template has no generation prompt (add_generation_prompt adds nothing)")
        return cls(tokenizer, tuple(header), tuple(body[len(content):]), kw)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered with the generation header (the episode's prompt)."""
        return encode(self.tokenizer, render(self.tokenizer, messages, add_generation_prompt=True,
                                             chat_template_kwargs=self.chat_template_kwargs))

    def close_ids(self, generated: Sequence[int]) -> list[int]:
        """Tokens that complete the assistant message after the model's ``generated`` ids.

        The longest tail of ``generated`` that is a prefix of :attr:`assistant_close` counts as
        already written by the model (normally its EOS); the rest of the closing is returned.
        """
        close = self.assistant_close
        for k in range(min(len(close), len(generated)), 0, -1):
            if tuple(generated[-k:]) == close[:k]:
                return list(close[k:])
        return list(close)

    def message_ids(self, role: str, content: str) -> list[int]:
        """Tokens of one non-assistant message after a closed assistant message, plus the next
        generation header: ``<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n`` in ChatML.
        """
        prefix = [*_DUMMY_PREFIX, {"role": "assistant", "content": _DUMMY_ASSISTANT}]
        kw = self.chat_template_kwargs
        before = encode(self.tokenizer, render(self.tokenizer, prefix, add_generation_prompt=False, chat_template_kwargs=kw))
        after = encode(self.tokenizer, render(self.tokenizer, [*prefix, {"role": role, "content": content}],
                                              add_generation_prompt=True, chat_template_kwargs=kw))
        return _strip_prefix(after, before, f"{role} message")

    def observation_ids(self, generated: Sequence[int], role: str, content: str) -> list[int]:
        """Everything appended (mask 0) between one generation and the next: the closing the model
        did not write, the observation message and the next generation header."""
        return self.close_ids(generated) + self.message_ids(role, content)


def clip_text(tokenizer: Any, text: str, max_tokens: int, marker: str = "\n... [truncated]") -> tuple[str, bool]:
    """``text`` cut to at most ``max_tokens`` tokens (plus ``marker``); returns ``(text, clipped)``."""
    if max_tokens <= 0:
        raise ValueError(f"seal.rollout.max_env_tokens must be > 0, got {max_tokens}")
    ids = encode(tokenizer, text)
    if len(ids) <= max_tokens:
        return text, False
    return tokenizer.decode(ids[:max_tokens], skip_special_tokens=False) + marker, True


@dataclass
class TokenTrace:
    """The growing token stream of one episode.

    ``prompt_ids`` (P,), then ``response_ids`` (R,) with ``response_mask`` (R,) = 1 exactly on the
    model's own tokens and ``response_logprobs`` (R,) = the sampler's log-probs there, 0.0 elsewhere.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    has_logprobs: bool = True

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def context(self) -> list[int]:
        """Prompt and response so far: what the next LLM call is conditioned on."""
        return self.prompt_ids + self.response_ids

    def add_model(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Append the model's own tokens (mask 1)."""
        self.response_ids.extend(int(t) for t in ids)
        self.response_mask.extend([1] * len(ids))
        if logprobs is None or len(logprobs) != len(ids):
            self.has_logprobs = False
            logprobs = [0.0] * len(ids)
        self.response_logprobs.extend(float(x) for x in logprobs)

    def add_env(self, ids: Sequence[int]) -> None:
        """Append template/observation tokens the model did not write (mask 0)."""
        self.response_ids.extend(int(t) for t in ids)
        self.response_mask.extend([0] * len(ids))
        self.response_logprobs.extend([0.0] * len(ids))
