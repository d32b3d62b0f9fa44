"""Chat policies for ``seal eval``: anything that completes a conversation with one reply.

``ChatPolicy.complete(messages, sampling) -> str`` is the whole contract. Two implementations:

- ``OpenAIChatPolicy``: any OpenAI-compatible ``/v1/chat/completions`` endpoint (a vLLM server, a
  hosted model), with bounded concurrency and bounded retries;
- ``HFChatPolicy``: a local Hugging Face checkpoint on CPU, an adapter over the rollout engine
  (:class:`seal.engine.hf_server.HFServerManager`): concurrent callers are batched and each
  conversation's key/values are reused from call to call.

Both also offer ``complete_with_usage`` (text plus token counts), which ``seal eval`` prefers.
:class:`ChatGenerator` plays a policy through the one episode loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import httpx

from seal.rollout.episode_loop import ContextFull, Reply

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingSettings:
    """Generation settings; the defaults are the validation ones (greedy, one sample)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p={self.top_p} must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens={self.max_tokens} must be >= 1")


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


class PolicyError(RuntimeError):
    """The policy could not produce a reply (after its retries)."""


class ContextOverflowError(PolicyError, ContextFull):
    """The conversation no longer fits the model's context window (the episode loop ends the
    episode there, as a local model's would)."""


@runtime_checkable
class ChatPolicy(Protocol):
    def complete(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> str: ...


def complete_with_usage(policy: ChatPolicy, messages: list[dict[str, Any]], sampling: SamplingSettings) -> Completion:
    """Ask ``policy`` for a reply, with token counts when the policy reports them."""
    fn = getattr(policy, "complete_with_usage", None)
    return fn(messages, sampling) if fn is not None else Completion(text=policy.complete(messages, sampling))


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, with the generation prompt."""
    ids = tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class ChatGenerator:
    """``seal eval``'s adapter for the episode loop (:class:`seal.rollout.episode_loop.Generator`): chat
    text to a :class:`ChatPolicy`, called in the worker's thread (one episode per worker and event loop).
    A policy with ``count_tokens`` is counted before each call (and its ``tokenizer`` clips
    observations); without, the loop has the server's usage, summed in ``prompt_tokens``/``response_tokens``."""

    def __init__(self, policy: ChatPolicy, sampling: SamplingSettings) -> None:
        self.policy, self.sampling = policy, sampling
        self.counter = getattr(policy, "count_tokens", None)
        self.tokenizer = getattr(policy, "tokenizer", None)
        self.per_call_tokens = sampling.max_tokens
        self.prompt_tokens = self.response_tokens = 0
        self._initial: int | None = None

    def start(self, messages: list[dict[str, Any]]) -> bool:
        if self.counter is not None:
            self._initial = self.counter(messages)
        return True

    def count(self, messages: list[dict[str, Any]], observation: dict | None) -> tuple[int, int] | None:
        if self.counter is None:
            return None
        context = self.counter(messages if observation is None else [*messages, observation])
        return context, context - self._initial

    def add_observation(self, observation: dict) -> None:
        """Nothing to keep: the next call sends the loop's messages."""

    async def generate(self, messages: list[dict[str, Any]], max_tokens: int) -> Reply:
        call = self.sampling if max_tokens == self.sampling.max_tokens else replace(self.sampling, max_tokens=max_tokens)
        comp = complete_with_usage(self.policy, messages, call)
        return Reply(comp.text, prompt_tokens=comp.prompt_tokens, completion_tokens=comp.completion_tokens)

    def accept(self, reply: Reply) -> None:
        self.prompt_tokens += reply.prompt_tokens
        self.response_tokens += reply.completion_tokens


_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_CONTEXT_ERROR = re.compile(r"context (length|window)|maximum context|too many tokens|prompt is too long", re.I)


class OpenAIChatPolicy:
    """Chat completions from an OpenAI-compatible server.

    ``base_url`` is the API root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``). At most
    ``max_concurrency`` requests are in flight across threads; transient failures (connection
    errors, timeouts, 408/409/429/5xx) are retried ``max_retries`` times with jittered
    exponential backoff; other 4xx fail at once because retrying cannot fix them.
    ``tokenizer_path``: the served model's tokenizer folder; gives the policy ``count_tokens``.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, max_concurrency: int = 8,
                 max_retries: int = 3, timeout_s: float = 300.0, backoff_s: float = 1.0,
                 transport: httpx.BaseTransport | None = None, tokenizer_path: str | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1")
        if max_retries < 0:
            raise ValueError(f"max_retries={max_retries} must be >= 0")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._slots = threading.BoundedSemaphore(max_concurrency)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                    transport=transport)
        # With the served model's tokenizer seal eval counts the context and clips observations
        # itself, as the trainers do; without one it has only the server's reported usage.
        self.tokenizer = None
        if tokenizer_path:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
            self.count_tokens = lambda messages: len(chat_prompt_ids(self.tokenizer, messages))

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> str:
        return self.complete_with_usage(messages, sampling).text

    def complete_with_usage(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> Completion:
        body: dict[str, Any] = {"model": self.model,
                                "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
                                "temperature": sampling.temperature, "top_p": sampling.top_p,
                                "max_tokens": sampling.max_tokens}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        with self._slots:
            data = self._post_with_retries(body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise PolicyError(f"chat endpoint returned an unexpected body: {str(data)[:200]}") from exc
        usage = data.get("usage") or {}
        return Completion(text=text, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0),
                          finish_reason=choice.get("finish_reason"))

    def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        last: str = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
                logger.warning("chat request failed (%s); retry %d/%d in %.1fs", last, attempt, self.max_retries, delay)
                time.sleep(delay)
            try:
                resp = self._client.post("/chat/completions", json=body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}"
                continue
            if resp.status_code == 400 and _CONTEXT_ERROR.search(resp.text):
                # vLLM and hosted APIs answer 400 when the conversation outgrew the model; the
                # episode ends there, as on a local model, instead of failing the run.
                raise ContextOverflowError(f"endpoint: {resp.text[:300]}")
            if resp.status_code >= 400:
                raise PolicyError(f"chat endpoint answered HTTP {resp.status_code}: {resp.text[:300]}")
            return resp.json()
        raise PolicyError(f"chat endpoint failed after {self.max_retries + 1} attempts: {last}")


class HFChatPolicy:
    """A local HF checkpoint (CPU only; serve a GPU one with vLLM and use :class:`OpenAIChatPolicy`)
    behind the chat template, served by the trainer's rollout engine (:class:`seal.engine.hf_server.HFServerManager`):
    concurrent callers are batched and each conversation's key/values are kept between its calls.
    The chat template gets no ``tools=``: the environment's system prompt already lists the tools.
    ``prefix_cache_tokens``: key/value positions kept (0 = no reuse); ``max_batch_tokens``: padded
    prompt tokens per prefill forward. The context length is the model's ``max_position_embeddings``.
    """

    def __init__(self, model_path: str, *, device: str = "cpu", dtype: str = "auto", max_batch_size: int = 8,
                 max_batch_tokens: int = 16384, batch_wait_s: float = 0.05,
                 prefix_cache_tokens: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from seal.engine.hf_server import DEFAULT_PREFIX_CACHE_TOKENS, HFServerManager

        if prefix_cache_tokens is not None and prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens={prefix_cache_tokens} must be >= 0 (0 = no key/value reuse)")
        if device != "cpu":
            raise ValueError(f"device={device!r}: HFChatPolicy runs on CPU; for a GPU, serve the checkpoint "
                             "with vLLM and evaluate it through the endpoint policy (--endpoint)")
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_resolve_dtype(torch, dtype, device))
        self.model.eval()
        self.device = device
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        cache_tokens = DEFAULT_PREFIX_CACHE_TOKENS if prefix_cache_tokens is None else prefix_cache_tokens
        # No autocast: greedy evaluation runs in the checkpoint's own dtype (fp32 on CPU keeps it
        # identical to the trainer's fp32 reference numbers).
        self.server = HFServerManager(
            self.model, self.tokenizer, max_batch_size=max_batch_size, batch_wait_ms=batch_wait_s * 1e3,
            autocast_dtype=None, prefix_cache_tokens=cache_tokens, prefill_token_budget=max_batch_tokens)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hf-policy", daemon=True)
        self._thread.start()

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        return len(chat_prompt_ids(self.tokenizer, messages))

    def complete(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> str:
        return self.complete_with_usage(messages, sampling).text

    def complete_with_usage(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> Completion:
        ids = chat_prompt_ids(self.tokenizer, messages)
        if self.context_length and len(ids) + sampling.max_tokens > self.context_length:
            raise ContextOverflowError(f"prompt of {len(ids)} tokens + max_tokens {sampling.max_tokens} exceeds the "
                                       f"context length {self.context_length}")
        params: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                  "max_tokens": sampling.max_tokens}
        eos = self.tokenizer.eos_token_id
        if eos is not None:  # the tokenizer's eos ends a reply too, next to the generation config's
            params["stop_token_ids"] = [int(eos)]
        call = self.server.generate(uuid.uuid4().hex, ids, params)
        try:
            out = asyncio.run_coroutine_threadsafe(call, self._loop).result()
        except Exception as exc:  # any engine failure is the caller's PolicyError
            raise PolicyError(f"generation failed: {type(exc).__name__}: {exc}") from exc
        row = list(out.token_ids)
        finish = "stop" if out.stop_reason == "completed" else "length"
        if finish == "stop":
            row = row[:-1]  # the stop id itself is not part of the reply
        text = self.tokenizer.decode(row, skip_special_tokens=True)
        return Completion(text, len(ids), len(row), finish)

    def set_seed(self, seed: int) -> None:
        """Seed torch's generator (sampling runs only; batching still changes the draw order)."""
        self._torch.manual_seed(seed)

    def close(self) -> None:
        """Stop the serving loop and the engine's thread."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self.server.close()


def _resolve_dtype(torch: Any, dtype: str, device: str) -> Any:
    if dtype == "auto":
        # fp32 on CPU keeps greedy decoding identical to the trainer's fp32 reference numbers.
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r}: use auto, float32, bfloat16 or float16") from None
