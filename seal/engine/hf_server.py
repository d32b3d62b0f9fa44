"""A batching Hugging Face ``generate`` server behind verl's ``server_manager.generate`` contract.

Concurrent episodes each ``await server.generate(request_id, prompt_ids, sampling_params)``. The
server collects the requests that arrive close together (a new one within ``batch_wait_ms`` of the
last, at most ``max_wait_ms`` in all, at most ``max_batch_size``) and generates them as ONE
left-padded batch in a private thread, so the event loop keeps collecting requests and running the
other episodes' environment steps meanwhile. Requests are batched only with others that share their
sampling settings (temperature, top-p, top-k); the batch decodes up to the largest ``max_tokens``
among them and each answer is cut to its own limit.

Two engines do the batch. With ``prefix_cache_tokens > 0`` (default) the server keeps the
key/values of recent contexts (:mod:`seal.engine.kv_cache`): each request computes only the part
of its context not seen before (in an episode, the last observation), the rows' new parts are
prefilled together in padded forwards (:func:`~seal.engine.kv_engine.prefill_many`), then the rows
decode together in a loop of the server's own (temperature, top-k, top-p sampling). Rows that share
at least ``shared_prefix_min_tokens`` leading tokens (the episodes of one task share the prompt)
read that prefix once per forward instead of once per row (:mod:`seal.engine.attention`). The
decode loop speculates by prompt lookup (``speculative``, on by default;
:mod:`seal.engine.speculative`): each row drafts the tokens that followed the last earlier
occurrence of its last few tokens, and one forward verifies them; the output is exactly what
plain decoding gives (greedy: the same tokens; sampled: the same distribution, and the same tokens
for a seeded request). With ``prefix_cache_tokens=0`` the batch is one left-padded
``model.generate`` call, which recomputes every context in full.

Semantics, documented because the trainer relies on them:

* **Device.** The server runs where the model is (CPU, or one GPU for the local trainer's
  ``seal.local.device=cuda``): inputs, cache buffers and autocast follow the model's device.
  Shared-prefix attention is CPU-only (it uses the CPU flash kernel); on a GPU each row keeps its
  own copy of the prompt.
* **Weights.** ``dtype=None`` (default) generates with the very module object passed in, so a
  trainer that updates that module in place is always sampled on-policy; ``autocast_dtype`` runs
  its matmuls in that dtype while the master weights stay fp32 (``None`` = off; ``"auto"``, the
  default: bf16 where the device runs it natively, else off, :mod:`seal.engine.precision`).
  ``dtype=torch.bfloat16`` keeps a private bf16 copy instead (half the memory of a second fp32
  copy); then call :meth:`HFServerManager.update_weights` after every optimizer step, which copies
  the weights in. On the 2-core CPU of docs/benchmarks.md, bf16 made prefill faster but decoding
  no faster than fp32 (see "## Rollout" there). Generation switches the
  module to eval mode for the call (so gradient checkpointing does not disable the KV cache) and
  restores its training flag afterwards; do not run the trainer on the shared module concurrently.
* **Log-probs.** ``log_probs[i]`` is ``log_softmax(logits / T)`` of the sampled token, computed from
  the model's raw logits before top-k/top-p truncation (``T`` = the request's temperature, 1 when
  greedy): the same quantity verl's actor computes, so old log-probs match up to numerics.
* **Randomness.** A request may carry its own ``seed`` (as in vLLM): its row then draws every
  sampled token from a generator of its own seeded with it, so its answer depends only on its
  prompt, sampling settings, seed and the weights (up to float rounding of batched forwards),
  not on its batch-mates, their order, earlier batches or the server ``seed``; seeds stay out of
  :class:`SamplingKey`, so differently seeded requests still share a batch. Each call restarts
  from the seed, so an episode should vary it per turn. Greedy requests ignore it. Rows without
  one draw as before: with ``seed=None`` from torch's global RNG; with ``seed=s``, batch ``k``
  from a generator seeded ``s + k`` (the ``generate`` engine: ``torch.manual_seed(s + k)`` inside
  ``fork_rng``), so the global RNG (the trainer's) is untouched and a run is repeatable when the
  batches are the same. HF's ``generate`` samples all rows with one ``torch.multinomial`` on the
  global RNG, so a ``generate`` batch with a seeded row runs greedy behind a processor that
  samples each row as the prefix-reuse engine does (same draws, same tokens up to rounding) and
  leaves only the drawn token: the batch stays one call instead of one call per seeded request.
  Every engine draws a sampled token by the inverse CDF with the row's prompt-lookup prediction
  ordered first (:mod:`seal.engine.sampling`), which is what lets speculation keep a seeded row's
  tokens: they do not depend on whether the prefix-reuse engine speculates or on its draft length
  (they do depend on ``speculative.ngram``, which sets the prediction). With speculation, rows
  without a seed draw from generators of their own seeded from that shared stream once per batch.
* **Cache and weights.** Cached key/values belong to the weights that computed them. Before each
  batch the server compares the parameters' in-place version counters (an optimizer step or
  ``load_state_dict`` bumps them) with those the cache was built under and drops the cache when
  they differ, so a trainer sharing the module needs no call; :meth:`HFServerManager.clear_cache`
  does it by hand (e.g. after replacing parameter tensors, which the counters cannot see).
* **Models.** The prefix-reuse engine implements plain full causal attention only (the
  architectures in :data:`seal.engine.kv_engine.SUPPORTED_MODEL_TYPES`, no sliding window,
  softcapping or other layer types); construction refuses any other model with one
  :class:`~seal.config.ConfigError` line (:func:`seal.engine.kv_engine.check_model`). The
  ``model.generate`` engine (``prefix_cache_tokens=0``) runs whatever the model implements.
* **Stopping.** A sequence stops at an end-of-message id: the model's ``generation_config``
  ``eos_token_id`` (``<|im_end|>`` for SmolLM2; the tokenizer's own eos is a different token) plus
  any ``stop_token_ids`` of the request. ``stop_reason`` is ``"completed"`` (stopped by such an id,
  which is included in ``token_ids``) or ``"length"`` (hit ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import numbers
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from verl.workers.rollout.replica import TokenOutput

from seal.engine import attention, draft_policy, kv_cache, kv_engine, precision, speculative
from seal.engine.ngram import NgramIndex
from seal.engine.sampling import (SamplingKey, filter_scores, make_chooser, row_streams,  # noqa: F401 (re-exported)
                                  sample_categorical)

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
DEFAULT_PREFIX_CACHE_TOKENS = 65536  # ~1.5 GB of SmolLM2 key/values in bf16, 3 GB in fp32
DEFAULT_PREFILL_TOKEN_BUDGET = 4096
# A request sharing this many more tokens with a batch-mate than with the cache waits for it.
WAIT_FOR_SHARED_MIN = 32


def parse_sampling_params(params: Mapping[str, Any], default_max_tokens: int
                          ) -> tuple[SamplingKey, int, int | None]:
    """``(key, max_tokens, seed)`` from verl-style sampling params.

    Recognised: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 or 0 = off),
    ``max_tokens`` / ``max_new_tokens``, ``stop_token_ids``, ``seed`` (the request's own sampling
    seed, ``None`` = none; kept out of the key so requests with different seeds share a batch).
    ``logprobs`` and ``repetition_penalty`` = 1 are accepted and ignored (log-probs are always
    returned).
    """
    temperature = float(params.get("temperature", 1.0))
    top_p = float(params.get("top_p", 1.0))
    top_k = int(params.get("top_k", -1) or -1)
    if temperature < 0:
        raise ValueError(f"sampling temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"sampling top_p must be in (0, 1], got {top_p}")
    if float(params.get("repetition_penalty", 1.0)) != 1.0:
        raise ValueError("repetition_penalty != 1 is not supported by the HF server")
    max_tokens = params.get("max_tokens", params.get("max_new_tokens", default_max_tokens))
    if max_tokens is None or int(max_tokens) < 1:
        raise ValueError(f"sampling max_tokens must be >= 1, got {max_tokens}")
    stop_ids = tuple(sorted(int(t) for t in params.get("stop_token_ids") or ()))
    return (SamplingKey(temperature, top_p if temperature > 0 else 1.0, top_k if temperature > 0 else -1, stop_ids),
            int(max_tokens), _parse_seed(params.get("seed")))


def _parse_seed(seed: Any) -> int | None:
    """A request seed: ``None``, or an integer in torch.Generator's range [0, 2**64).

    Booleans and floats are refused rather than coerced: ``seed=1.5`` or ``True`` is a caller's
    bug, and silently rounding it would hide that two requests share a stream.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"sampling seed must be an integer in [0, 2**64) or None, got {seed!r}")
    return int(seed)


class _LogProbRecorder(LogitsProcessor):
    """Records ``log_softmax(raw_logits / T)`` of each sampled token, step by step.

    HF runs custom processors before its temperature/top-k/top-p warpers, so ``scores`` here are
    the raw logits (B, V). The token chosen at step t is only visible at step t+1 (as the last
    column of ``input_ids``), so one (B, V) distribution is kept between calls.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self._prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []  # each (B,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prev is not None:
            self.steps.append(self._prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self._prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """Log-probs (B, N) of ``new_tokens`` (B, N), the generated part of the sequences."""
        steps = list(self.steps)
        if self._prev is not None and new_tokens.shape[1] > len(steps):
            steps.append(self._prev.gather(1, new_tokens[:, len(steps):len(steps) + 1]).squeeze(1))
        if not steps:
            return torch.zeros(new_tokens.shape[0], 0)
        return torch.stack(steps, dim=1)[:, : new_tokens.shape[1]]


class _RowSampler(LogitsProcessor):
    """Samples every row itself (:func:`make_chooser`) and leaves only the drawn token, for a
    greedy ``model.generate`` to pick: HF samples all rows with one ``torch.multinomial`` on the
    global RNG, which cannot give each row its own generator. Runs after :class:`_LogProbRecorder`
    (which must see the raw logits). HF's rows never leave the batch, so row i is request i.
    Each row's prompt-lookup prediction (order ``ngram``) orders its draw, as in the prefix-reuse
    engine; ``prompt_lengths`` say where a left-padded row's own tokens start.
    """

    def __init__(self, choose: Callable[..., torch.Tensor], prompt_lengths: Sequence[int], ngram: int) -> None:
        self.choose = choose
        self.prompt_lengths = list(prompt_lengths)
        self.ngram = ngram
        self.indices: list[NgramIndex] | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.indices is None:  # the first call sees the prompts; each later one adds a column
            rows = input_ids.tolist()
            self.indices = [NgramIndex(row[len(row) - n:], self.ngram) for row, n in zip(rows, self.prompt_lengths)]
        else:
            for index, token in zip(self.indices, input_ids[:, -1].tolist()):
                index.push(token)
        hints = torch.tensor([index.hint() for index in self.indices], device=scores.device)
        tokens = self.choose(scores, None, hints)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    key: SamplingKey
    max_tokens: int
    future: asyncio.Future
    seed: int | None = None  # the request's own sampling seed (module docstring, "Randomness")


@dataclass
class ServerStats:
    """Counters for benchmarks and logs."""

    batches: int = 0
    requests: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    prefill_seconds: float = 0.0  # prefix-reuse engine only: prefill part of generate_seconds
    decode_seconds: float = 0.0  # prefix-reuse engine only: decode part
    decode_row_steps: int = 0  # prefix-reuse engine only: rows computed, summed over decode steps
    decode_steps: int = 0  # prefix-reuse engine only: decode forwards
    drafted_tokens: int = 0  # speculative decoding: draft tokens verified
    accepted_tokens: int = 0  # of which accepted (each one a token without a forward of its own)
    batch_sizes: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        n = max(self.batches, 1)
        return {"batches": self.batches, "requests": self.requests, "generated_tokens": self.generated_tokens,
                "generate_seconds": round(self.generate_seconds, 3),
                "prefill_seconds": round(self.prefill_seconds, 3), "decode_seconds": round(self.decode_seconds, 3),
                "decode_row_steps": self.decode_row_steps, "decode_steps": self.decode_steps,
                "drafted_tokens": self.drafted_tokens, "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": round(self.accepted_tokens / max(self.drafted_tokens, 1), 3),
                "mean_batch_size": round(sum(self.batch_sizes) / n, 2),
                "tokens_per_second": round(self.generated_tokens / max(self.generate_seconds, 1e-9), 2)}


class HFServerManager:
    """verl-compatible ``server_manager`` over one Hugging Face causal LM (see the module docstring).

    Args:
        model: a ``transformers`` causal LM (shared with the trainer unless ``dtype`` is given).
        tokenizer: its tokenizer (used for the pad id only).
        max_batch_size: most requests in one ``generate``.
        batch_wait_ms: collect more requests while each arrives within this gap of the previous one.
        max_wait_ms: never hold the first request longer than this before starting a batch.
        dtype: ``None`` shares ``model``; a dtype keeps a private copy in that dtype.
        autocast_dtype: autocast dtype for generation (``None`` = off, ``"auto"`` = bf16 where the
            model's device runs it natively); ignored when the model already runs in that dtype.
        seed: see "Randomness" in the module docstring.
        default_max_tokens: ``max_tokens`` when a request names none.
        prefix_cache_tokens: positions of key/values kept for reuse (0 = use ``model.generate``).
        prefill_token_budget: most padded new tokens (rows x longest) in one prefill forward of
            the prefix-reuse engine; larger batches are split.
        shared_prefix_min_tokens: rows of a batch sharing at least this many leading tokens read
            that prefix once per step (shared-prefix attention, prefix-reuse engine; 0 = off).
        speculative: prompt-lookup speculative decoding (prefix-reuse engine;
            :class:`~seal.engine.speculative.SpeculativeSettings`); its ``ngram`` also orders the
            sampled draws of both engines.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_batch_size: int = 16,
                 batch_wait_ms: float = 30.0, max_wait_ms: float = 500.0, dtype: torch.dtype | None = None,
                 autocast_dtype: torch.dtype | str | None = "auto", seed: int | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
                 prefill_token_budget: int = DEFAULT_PREFILL_TOKEN_BUDGET,
                 shared_prefix_min_tokens: int = kv_engine.DEFAULT_MIN_SHARED,
                 speculative: speculative.SpeculativeSettings = speculative.SpeculativeSettings()) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0 or max_wait_ms < 0:
            raise ValueError("batch_wait_ms and max_wait_ms must be >= 0")
        if prefill_token_budget < 1:
            raise ValueError(f"prefill_token_budget must be >= 1, got {prefill_token_budget}")
        if shared_prefix_min_tokens < 0:
            raise ValueError(f"shared_prefix_min_tokens must be >= 0, got {shared_prefix_min_tokens}")
        if prefix_cache_tokens > 0:  # the prefix-reuse engine computes attention itself
            kv_engine.check_model(model)
        self.prefill_token_budget = prefill_token_budget
        self.shared_prefix_min_tokens = shared_prefix_min_tokens
        self.speculative = speculative
        self.draft_policy = draft_policy.DraftPolicy()  # learns what drafting pays here, across batches
        self.model = copy.deepcopy(model).to(dtype) if dtype is not None else model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1e3
        self.max_wait_s = max_wait_ms / 1e3
        self.seed = seed
        self.default_max_tokens = default_max_tokens
        self.eos_ids = self._eos_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.device = next(self.model.parameters()).device  # inputs, cache buffers and autocast follow it
        if isinstance(autocast_dtype, str):
            choice = precision.resolve_autocast(autocast_dtype, self.device)
            precision.log_choice(autocast_dtype, choice, "generation server")
            autocast_dtype = choice.dtype
        self.autocast_dtype = autocast_dtype
        self.stats = ServerStats()
        self.prefix_cache = kv_cache.PrefixStore(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        self._cache_version: tuple[int, ...] = ()
        self._pending: list[_Request] = []
        self._batcher: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generate")

    @staticmethod
    def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is None:
            eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the model's generation_config and the tokenizer define no eos_token_id; "
                             "set model.generation_config.eos_token_id to the end-of-message token")
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> TokenOutput:
        """Generate a continuation of ``prompt_ids``; verl's contract (multimodal kwargs must be None)."""
        extra = [k for k, v in kwargs.items() if v is not None]
        if extra:
            raise ValueError(f"HFServerManager is text-only; unsupported generate arguments: {extra}")
        key, max_tokens, seed = parse_sampling_params(sampling_params, self.default_max_tokens)
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("generate needs a non-empty prompt")
        if self.max_positions is not None:
            room = self.max_positions - len(prompt)
            if room < 1:
                raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the model's "
                                 f"{self.max_positions}-token context")
            max_tokens = min(max_tokens, room)
        loop = asyncio.get_running_loop()
        request = _Request(request_id, prompt, key, max_tokens, loop.create_future(), seed)
        self._pending.append(request)
        if self._batcher is None or self._batcher.done() or self._batcher.get_loop() is not loop:
            self._batcher = loop.create_task(self._run_batches(), name="hf-batcher")
        return await request.future

    def update_weights(self, source: torch.nn.Module) -> None:
        """Copy ``source``'s weights into the server's model (needed only with a private copy)."""
        if source is not self.model:
            with torch.no_grad():
                self.model.load_state_dict(source.state_dict())
        self.clear_cache()

    def clear_cache(self) -> None:
        """Forget cached key/values (they were computed by the previous weights)."""
        if self.prefix_cache is not None:
            self.prefix_cache.entries.clear()

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._collect()
            batch = self._take_batch()
            try:
                outputs = await loop.run_in_executor(self._executor, self._generate_batch, batch)
            except Exception as err:  # every waiter sees the failure; the batcher keeps serving
                log.warning("generate failed for a batch of %d: %s: %s", len(batch), type(err).__name__, err)
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(err)
                continue
            for req, out in zip(batch, outputs):
                if not req.future.done():
                    req.future.set_result(out)

    async def _collect(self) -> None:
        """Wait while requests keep arriving (each within ``batch_wait_s``), up to the limits."""
        start = time.monotonic()
        seen = -1
        while len(self._pending) < self.max_batch_size and len(self._pending) != seen:
            if time.monotonic() - start >= self.max_wait_s:
                break
            seen = len(self._pending)
            await asyncio.sleep(self.batch_wait_s)

    def _take_batch(self) -> list[_Request]:
        key = self._pending[0].key
        batch = [r for r in self._pending if r.key == key][: self.max_batch_size]
        taken = {id(r) for r in batch}
        self._pending = [r for r in self._pending if id(r) not in taken]
        return batch

    @contextlib.contextmanager
    def _generation_mode(self) -> Iterator[None]:
        was_training = self.model.training
        self.model.eval()
        use_autocast = self.autocast_dtype is not None and next(self.model.parameters()).dtype != self.autocast_dtype
        try:
            # no_grad, not inference_mode: under inference_mode autocast re-casts every weight on
            # every forward; under no_grad it casts each once per batch (its cast cache).
            with torch.no_grad(), torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                                                        enabled=use_autocast):
                yield
        finally:
            self.model.train(was_training)

    def _generate_batch(self, batch: list[_Request]) -> list[TokenOutput]:
        """Generate one batch (in the server's thread); returns one output per request."""
        stop_ids = set(self.eos_ids) | set(batch[0].key.stop_ids)
        if self.prefix_cache is not None:
            version = tuple(p._version for p in self.model.parameters())  # in-place modification counters
            if version != self._cache_version:
                self.clear_cache()
                self._cache_version = version
        started = time.monotonic()
        with self._generation_mode():
            if self.prefix_cache is not None:
                with attention.server_attention_for(self.model):
                    results = self._cached_batch(batch, stop_ids)
            else:
                results = self._hf_generate_batch(batch, stop_ids)
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.batch_sizes.append(len(batch))
        self.stats.generated_tokens += sum(len(o.token_ids) for o in results)
        self.stats.generate_seconds += time.monotonic() - started
        return results

    def _kv_dtype(self) -> torch.dtype:
        dtype = next(self.model.parameters()).dtype
        if self.autocast_dtype is not None and dtype != self.autocast_dtype:
            return self.autocast_dtype
        return dtype

    def _cached_batch(self, batch: list[_Request], stop_ids: set[int]) -> list[TokenOutput]:
        """Prefill each request past its longest cached prefix, then decode all rows together."""
        store = self.prefix_cache
        shape = kv_cache.KVShape.of(self.model.config, self._kv_dtype(), self.device)
        started = time.monotonic()
        rows, first = self._prefill_rows(batch, shape)
        self.stats.prefill_seconds += time.monotonic() - started
        key = batch[0].key
        generator = None
        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed + self.stats.batches)
        choose = make_chooser(key, generator, self._row_generators(batch))
        temperature = key.temperature if key.temperature > 0 else 1.0

        def logprob_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(logits / temperature, dim=-1).gather(1, tokens[:, None]).squeeze(1)

        started = time.monotonic()
        limits, spec, sampled = [r.max_tokens for r in batch], self.speculative, key.temperature > 0
        if spec.enable:
            streams = row_streams([r.seed for r in batch], generator) if sampled else None
            out = speculative.decode(self.model, shape, rows, torch.stack(first), limits, key, streams, logprob_of,
                                     stop_ids, self.pad_id, spec, self.shared_prefix_min_tokens, self.draft_policy)
        else:
            out = kv_engine.decode(self.model, shape, rows, torch.stack(first), limits, choose, logprob_of, stop_ids,
                                   self.pad_id, self.shared_prefix_min_tokens, spec.ngram if sampled else 0)
        self.stats.decode_seconds += time.monotonic() - started
        self.stats.decode_row_steps += out.row_steps
        self.stats.decode_steps += out.steps
        self.stats.drafted_tokens += out.drafted
        self.stats.accepted_tokens += out.accepted
        for entry in out.entries:
            store.put(entry)
        return [TokenOutput(token_ids=t, log_probs=lp, stop_reason="completed" if done else "length")
                for t, lp, done in zip(out.tokens, out.logprobs, out.stopped)]

    @staticmethod
    def _row_generators(batch: list[_Request]) -> list[torch.Generator | None] | None:
        """A fresh generator per seeded request of a sampled batch (``None`` for the others), or
        ``None`` when no request has a seed or the batch is greedy (which draws nothing)."""
        if batch[0].key.temperature <= 0 or all(r.seed is None for r in batch):
            return None
        return [torch.Generator().manual_seed(r.seed) if r.seed is not None else None for r in batch]

    def _prefill_rows(self, batch: list[_Request], shape: kv_cache.KVShape
                      ) -> tuple[list[kv_cache.Entry], list[torch.Tensor]]:
        """Prefill every request past its longest cached prefix, rows batched together.

        Requests sharing a long uncached prefix with an earlier one in the batch (the n episodes
        of one task on their first call) wait for a second wave, so that prefix is computed once
        and they reuse it. Returns the rows' entries and next-token logits (V,), in batch order.
        """
        store = self.prefix_cache
        contexts = [torch.tensor(r.prompt_ids, dtype=torch.long) for r in batch]
        rows: list[kv_cache.Entry | None] = [None] * len(batch)
        first: list[torch.Tensor | None] = [None] * len(batch)
        pending = list(range(len(batch)))
        while pending:
            wave, deferred, items = [], [], []
            for i in pending:
                _, reuse = store.lookup(contexts[i], record=False)
                if any(kv_cache.common_prefix(contexts[j], contexts[i]) > reuse + WAIT_FOR_SHARED_MIN for j in wave):
                    deferred.append(i)
                    continue
                entry, reuse = store.lookup(contexts[i])
                wave.append(i)
                items.append(kv_engine.PrefillItem(batch[i].prompt_ids, entry, reuse))
            done = kv_engine.prefill_many(self.model, shape, items, self.prefill_token_budget,
                                         self.shared_prefix_min_tokens)
            for i, (row, logits) in zip(wave, done):
                store.put(row)
                rows[i], first[i] = row, logits
            pending = deferred
        return [r for r in rows if r is not None], [f for f in first if f is not None]

    def _hf_generate_batch(self, batch: list[_Request], stop_ids: set[int]) -> list[TokenOutput]:
        """Left-pad ``batch`` into (B, L) and run one ``model.generate``."""
        key = batch[0].key
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            input_ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attention[i, width - len(r.prompt_ids):] = 1
        row_generators = self._row_generators(batch)
        # With a seeded row the batch samples in _RowSampler (per-row generators) and HF only takes
        # its argmax; without one, HF samples as before.
        sampling = key.temperature > 0 and row_generators is None
        config = GenerationConfig(
            max_new_tokens=max(r.max_tokens for r in batch), do_sample=sampling,
            temperature=key.temperature if sampling else None, top_p=key.top_p if sampling else None,
            top_k=(key.top_k if key.top_k > 0 else 0) if sampling else None,
            eos_token_id=sorted(stop_ids), pad_token_id=self.pad_id, use_cache=True, return_dict_in_generate=True)
        recorder = _LogProbRecorder(key.temperature)
        processors = [recorder]
        if row_generators is not None:  # rows without a seed draw from the global RNG, seeded below
            processors.append(_RowSampler(make_chooser(key, None, row_generators), [len(r.prompt_ids) for r in batch],
                                          self.speculative.ngram))
        gpus = [self.device.index or 0] if self.device.type == "cuda" else []
        rng = torch.random.fork_rng(devices=gpus) if self.seed is not None else contextlib.nullcontext()
        with rng:
            if self.seed is not None:
                torch.manual_seed(self.seed + self.stats.batches)
            out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                      generation_config=config,
                                      logits_processor=LogitsProcessorList(processors))
        new_tokens = out.sequences[:, width:]
        logprobs = recorder.finish(new_tokens)
        return [self._trim(r, new_tokens[i].tolist(), logprobs[i].tolist(), stop_ids) for i, r in enumerate(batch)]

    @staticmethod
    def _trim(req: _Request, tokens: list[int], logprobs: list[float], stop_ids: set[int]) -> TokenOutput:
        """Cut a row at its first stop id (kept) or at the request's own ``max_tokens``."""
        limit = min(len(tokens), req.max_tokens)
        for j in range(limit):
            if tokens[j] in stop_ids:
                return TokenOutput(token_ids=tokens[: j + 1], log_probs=logprobs[: j + 1], stop_reason="completed")
        return TokenOutput(token_ids=tokens[:limit], log_probs=logprobs[:limit], stop_reason="length")
