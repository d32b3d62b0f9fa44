"""Chat policies for ``seal eval``: anything that completes a conversation with one reply.

``ChatPolicy.complete(messages, sampling) -> str`` is the whole contract. Two implementations:

- ``OpenAIChatPolicy``: any OpenAI-compatible ``/v1/chat/completions`` endpoint (a vLLM server, a
  hosted model), with bounded concurrency and bounded retries;
- ``HFChatPolicy``: a local Hugging Face checkpoint (CPU or GPU), chat template + ``generate``;
  concurrent callers are batched into one left-padded ``generate``.

Both also offer ``complete_with_usage`` (text plus token counts), which the runner prefers.
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import httpx

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


class PolicyError(RuntimeError):
    """The policy could not produce a reply (after its retries)."""


class ContextOverflowError(PolicyError):
    """The conversation no longer fits the model's context window."""


@runtime_checkable
class ChatPolicy(Protocol):
    def complete(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> str: ...


def complete_with_usage(
    policy: ChatPolicy, messages: list[dict[str, Any]], sampling: SamplingSettings
) -> Completion:
    """Ask ``policy`` for a reply, with token counts when the policy reports them."""
    fn = getattr(policy, "complete_with_usage", None)
    if fn is not None:
        return fn(messages, sampling)
    return Completion(text=policy.complete(messages, sampling))


# --------------------------------------------------------------------------- OpenAI-compatible


_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_CONTEXT_ERROR = re.compile(r"context (length|window)|maximum context|too many tokens|prompt is too long", re.I)


class OpenAIChatPolicy:
    """Chat completions from an OpenAI-compatible server.

    ``base_url`` is the API root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``). At most
    ``max_concurrency`` requests are in flight across threads; transient failures (connection
    errors, timeouts, 408/409/429/5xx) are retried ``max_retries`` times with jittered
    exponential backoff; other 4xx fail at once because retrying cannot fix them.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 8,
        max_retries: int = 3,
        timeout_s: float = 300.0,
        backoff_s: float = 1.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1")
        if max_retries < 0:
            raise ValueError(f"max_retries={max_retries} must be >= 0")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._slots = threading.BoundedSemaphore(max_concurrency)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> str:
        return self.complete_with_usage(messages, sampling).text

    def complete_with_usage(
        self, messages: list[dict[str, Any]], sampling: SamplingSettings
    ) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
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
        return Completion(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
        )

    def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        last: str = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
                logger.warning("chat request failed (%s); retry %d/%d in %.1fs",
                               last, attempt, self.max_retries, delay)
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
                raise PolicyError(
                    f"chat endpoint answered HTTP {resp.status_code}: {resp.text[:300]}"
                )
            return resp.json()
        raise PolicyError(f"chat endpoint failed after {self.max_retries + 1} attempts: {last}")


# --------------------------------------------------------------------------- local HF checkpoint


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingSettings
    done: threading.Event
    result: Completion | None = None
    error: BaseException | None = None


class HFChatPolicy:
    """A local HF causal LM behind the chat template, batching concurrent requests.

    Requests that arrive within ``batch_wait_s`` of each other and share sampling settings run
    as one left-padded ``generate`` of at most ``max_batch_size`` rows and ``max_batch_tokens``
    padded prompt tokens (batch 8 is ~3.5x the decode tokens/s of batch 1 on CPU, but long
    prompts are prefill-bound and a padded batch of them only costs memory). The chat template
    gets no ``tools=``: the environment's system prompt already lists the tools.

    With ``prefix_cache=N`` requests run one at a time and reuse the KV cache of the longest
    matching earlier conversation (up to N kept): each call of a multi-turn episode then only
    prefills the new messages instead of the whole (several-thousand-token) prompt again.
    """

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        max_batch_size: int = 8,
        max_batch_tokens: int = 16384,
        batch_wait_s: float = 0.05,
        context_length: int | None = None,
        prefix_cache: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = _resolve_dtype(torch, dtype, device)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device)
        self.model.eval()
        self.device = device
        self.context_length = context_length or int(
            getattr(self.model.config, "max_position_embeddings", 0) or 0
        ) or None
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        # Conversation KV caches, most recent last: (token ids the cache holds, cache).
        self.prefix_cache = prefix_cache
        self._caches: list[tuple[list[int], Any]] = []
        self.batch_wait_s = batch_wait_s
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="hf-policy", daemon=True)
        self._worker.start()

    # -- public ------------------------------------------------------------------------------

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """Prompt token ids: the chat template with the generation prompt."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True,
            tokenize=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        return len(self.encode(messages))

    def complete(self, messages: list[dict[str, Any]], sampling: SamplingSettings) -> str:
        return self.complete_with_usage(messages, sampling).text

    def complete_with_usage(
        self, messages: list[dict[str, Any]], sampling: SamplingSettings
    ) -> Completion:
        ids = self.encode(messages)
        if self.context_length and len(ids) + sampling.max_tokens > self.context_length:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens + max_tokens {sampling.max_tokens} exceeds the "
                f"context length {self.context_length}"
            )
        req = _Request(prompt_ids=ids, sampling=sampling, done=threading.Event())
        self._queue.put(req)
        req.done.wait()
        if req.error is not None:
            raise PolicyError(f"generation failed: {req.error}") from req.error
        assert req.result is not None
        return req.result

    # -- batching worker -----------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if self.prefix_cache:
                try:
                    first.result = self._generate_cached(first)
                except Exception as exc:  # handed to the caller, which raises PolicyError
                    first.error = exc
                first.done.set()
                continue
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
                try:
                    nxt = self._queue.get(timeout=timeout)
                except queue.Empty:
                    break
                width = max(len(r.prompt_ids) for r in [*batch, nxt])
                if nxt.sampling != first.sampling or width * (len(batch) + 1) > self.max_batch_tokens:
                    # It cannot share this generate call (other settings, or over the token
                    # budget); it is served next round.
                    self._queue.put(nxt)
                    break
                batch.append(nxt)
            try:
                for req, res in zip(batch, self._generate(batch)):
                    req.result = res
            except Exception as exc:  # handed to every waiting caller, which raises PolicyError
                for req in batch:
                    req.error = exc
            for req in batch:
                req.done.set()

    def _generate_kwargs(self, s: SamplingSettings) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_new_tokens": s.max_tokens, "pad_token_id": self.tokenizer.pad_token_id}
        if s.temperature > 0:
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p)
        else:
            # Explicit Nones silence the checkpoint's sampling defaults under greedy decoding.
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kwargs

    def set_seed(self, seed: int) -> None:
        """Seed torch's generator (sampling runs only; batching still changes the draw order)."""
        self._torch.manual_seed(seed)

    def _take_cache(self, ids: list[int]) -> Any:
        """The kept cache sharing the longest prefix with ``ids``, cropped to it (or a new one)."""
        from transformers import DynamicCache

        best, best_len = None, 0
        for i, (held, _) in enumerate(self._caches):
            n = 0
            for a, b in zip(held, ids):
                if a != b:
                    break
                n += 1
            if n > best_len:
                best, best_len = i, n
        # Every conversation starts with the same system-prompt preamble; a cache is only worth
        # taking (and so removing from its own conversation) when most of it matches.
        if best is None or best_len < max(16, len(self._caches[best][0]) // 2):
            return DynamicCache()
        _, cache = self._caches.pop(best)
        cache.crop(min(best_len, len(ids) - 1))  # at least one prompt token must be fed
        return cache

    def _generate_cached(self, req: _Request) -> Completion:
        """Batch-1 ``generate`` continuing a kept KV cache; the cache is kept for the next call."""
        torch = self._torch
        cache = self._take_cache(req.prompt_ids)
        reused = cache.get_seq_length()
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=self.device)  # (1, T)
        kwargs = self._generate_kwargs(req.sampling)
        t0 = time.monotonic()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      past_key_values=cache, **kwargs)
        row = out[0, len(req.prompt_ids):].tolist()
        held = (req.prompt_ids + row)[: cache.get_seq_length()]
        self._caches.append((held, cache))
        del self._caches[: -self.prefix_cache]
        logger.debug("generate: %d prompt tokens (%d cached), %d new, %.1fs", len(req.prompt_ids), reused,
                     len(row), time.monotonic() - t0)
        eos = self.tokenizer.eos_token_id
        finish = "length"
        if eos in row:
            row = row[: row.index(eos)]
            finish = "stop"
        return Completion(self.tokenizer.decode(row, skip_special_tokens=True), len(req.prompt_ids), len(row), finish)

    def _generate(self, batch: list[_Request]) -> list[Completion]:
        """One left-padded ``generate`` for ``batch``; returns one Completion per request."""
        torch = self._torch
        pad = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, T)
        attention = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T)
        for i, r in enumerate(batch):
            input_ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attention[i, width - len(r.prompt_ids):] = 1
        kwargs = self._generate_kwargs(batch[0].sampling)
        t0 = time.monotonic()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), **kwargs
            )
        new = out[:, width:].cpu()  # (B, T_new)
        logger.debug("generate: batch %d x %d prompt tokens, %d new, %.1fs", len(batch), width,
                     new.shape[1], time.monotonic() - t0)
        eos = self.tokenizer.eos_token_id
        results = []
        for i, r in enumerate(batch):
            row = new[i].tolist()
            finish = "length"
            if eos in row:
                row = row[: row.index(eos)]
                finish = "stop"
            while row and row[-1] == pad:
                row.pop()
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            results.append(Completion(text, len(r.prompt_ids), len(row), finish))
        return results


def _resolve_dtype(torch: Any, dtype: str, device: str) -> Any:
    if dtype == "auto":
        # fp32 on CPU keeps greedy decoding identical to the trainer's fp32 reference numbers.
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r}: use auto, float32, bfloat16 or float16") from None
