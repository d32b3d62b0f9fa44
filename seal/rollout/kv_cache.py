"""Prefix KV reuse for the HF server: a store of past key/values and a batched decode loop.

On CPU the cost of an episode's LLM call is dominated by re-reading its whole context (a BFCL
prompt is 3.5k-7k tokens) when only the last observation is new. The server therefore keeps the
key/value tensors of recent contexts in a :class:`PrefixStore`; a request reuses the longest stored
prefix it shares (the same episode's previous call, or a sibling episode of the same task) and
computes only the rest (:func:`prefill`). The rows of a batch are then decoded together
(:func:`decode`) over one left-padded cache of preallocated buffers, so no step copies the cache.

Works with decoder-only models whose attention uses a standard per-layer key/value cache and
explicit ``position_ids`` (Llama, Mistral, Qwen2 families). Keys are cached after RoPE at their
true positions, which left padding preserves (positions count real tokens only).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GQA_ATTENTION = "seal_gqa_sdpa"


def gqa_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA for one-token decode steps without copying the grouped key/value heads.

    transformers' CPU path expands keys/values (B, Hkv, L, D) to all query heads before SDPA,
    which copies the whole cache every step. For a single query position the query heads of one
    group can instead be laid out as that group's "query length": (B, H, 1, D) -> (B, Hkv, H/Hkv, D),
    and every one of them sees the same mask row. Prefill (several positions) uses the stock SDPA.
    """
    b, h, q, d = query.shape
    hkv = key.shape[1]
    if q != 1 or h == hkv or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    grouped = query.reshape(b, hkv, h // hkv, d)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


# Registered by name (like a verl agent loop); selecting it is per model, see ``decode_attention``.
AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention)
AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)


@contextlib.contextmanager
def decode_attention(model: torch.nn.Module) -> Iterator[None]:
    """Use :func:`gqa_sdpa_attention` inside the block when the model runs stock ``sdpa``."""
    config = model.config
    previous = getattr(config, "_attn_implementation", None)
    if previous != "sdpa":
        yield
        return
    config._attn_implementation = GQA_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


class BufferLayer(DynamicLayer):
    """A cache layer writing into preallocated (B, H, capacity, D) buffers instead of concatenating."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self._kbuf, self._vbuf, self._n = keys, values, length
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.keys, self.values = keys[..., :length, :], values[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._n + key_states.shape[-2]
        if end > self._kbuf.shape[-2]:
            raise RuntimeError(f"KV buffer of {self._kbuf.shape[-2]} positions overflowed ({end})")
        self._kbuf[..., self._n:end, :] = key_states
        self._vbuf[..., self._n:end, :] = value_states
        self._n = end
        self.keys, self.values = self._kbuf[..., :end, :], self._vbuf[..., :end, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n


@dataclass(frozen=True)
class KVShape:
    layers: int
    heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, config: object, dtype: torch.dtype) -> KVShape:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, heads, head_dim, dtype)

    def buffers(self, batch: int, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (batch, self.heads, capacity, self.head_dim)
        return ([torch.zeros(shape, dtype=self.dtype) for _ in range(self.layers)],
                [torch.zeros(shape, dtype=self.dtype) for _ in range(self.layers)])


@dataclass(eq=False)  # identity: entries hold tensors
class Entry:
    """Keys/values (per layer (H, n, D)) of the context ``tokens`` (n,)."""

    tokens: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    stamp: int = 0

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


@dataclass
class PrefixStore:
    """Least-recently-used store of contexts' key/values, at most ``max_tokens`` positions in all."""

    max_tokens: int
    entries: list[Entry] = field(default_factory=list)
    hits: int = 0
    reused_tokens: int = 0
    _clock: itertools.count = field(default_factory=itertools.count)

    @property
    def tokens(self) -> int:
        return sum(len(e) for e in self.entries)

    def lookup(self, tokens: torch.Tensor, *, record: bool = True) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens`` and that length, which is kept
        below ``len(tokens)`` so at least one token is computed (its logits start the answer).
        ``record=False`` only looks (no hit counted, no recency update)."""
        best, best_len = None, 0
        for entry in self.entries:
            m = common_prefix(entry.tokens, tokens)
            if m > best_len:
                best, best_len = entry, m
        best_len = min(best_len, int(tokens.shape[0]) - 1)
        if best is None or best_len <= 0:
            return None, 0
        if record:
            best.stamp = next(self._clock)
            self.hits += 1
            self.reused_tokens += best_len
        return best, best_len

    def put(self, entry: Entry) -> None:
        """Add ``entry``; entries it extends (their tokens are its prefix) are dropped."""
        if self.max_tokens <= 0:
            return
        entry.stamp = next(self._clock)
        self.entries = [e for e in self.entries
                        if not (len(e) <= len(entry) and common_prefix(e.tokens, entry.tokens) == len(e))]
        self.entries.append(entry)
        while self.tokens > self.max_tokens and len(self.entries) > 1:
            self.entries.remove(min(self.entries, key=lambda e: e.stamp))
        if self.tokens > self.max_tokens:
            self.entries.clear()


Model = Callable[..., object]


def prefill(model: Model, shape: KVShape, tokens: list[int], entry: Entry | None, reuse: int
            ) -> tuple[Entry, torch.Tensor]:
    """Compute the key/values of ``tokens`` reusing ``entry``'s first ``reuse`` positions.

    Returns the context's entry (per layer (H, n, D)) and the next-token logits (V,), float32.
    """
    n = len(tokens)
    keys, values = shape.buffers(1, n)
    if entry is not None and reuse > 0:
        for k, v, ek, ev in zip(keys, values, entry.keys, entry.values):
            k[0, :, :reuse] = ek[:, :reuse]
            v[0, :, :reuse] = ev[:, :reuse]
    else:
        reuse = 0
    cache = Cache(layers=[BufferLayer(k, v, reuse) for k, v in zip(keys, values)])
    out = model(input_ids=torch.tensor([tokens[reuse:]]), attention_mask=torch.ones(1, n, dtype=torch.long),
                position_ids=torch.arange(reuse, n)[None], past_key_values=cache, use_cache=True, logits_to_keep=1)
    ids = torch.tensor(tokens, dtype=torch.long)
    return Entry(ids, [k[0] for k in keys], [v[0] for v in values]), out.logits[0, -1].float()


@dataclass(frozen=True)
class PrefillItem:
    """One context to prefill: its ``tokens`` and the stored ``entry`` whose first ``reuse`` match."""

    tokens: list[int]
    entry: Entry | None
    reuse: int

    @property
    def new(self) -> int:
        return len(self.tokens) - (self.reuse if self.entry is not None else 0)


def prefill_many(model: Model, shape: KVShape, items: list[PrefillItem], token_budget: int = 4096
                 ) -> list[tuple[Entry, torch.Tensor]]:
    """:func:`prefill` for several contexts, rows with similar new-token counts in one forward.

    Rows are sorted by how many tokens they add and cut into chunks whose longest row is at most
    twice the shortest (plus 32), so padding wastes little, and whose padded size (rows x longest)
    stays within ``token_budget`` (the attention scores grow with it). A chunk of one row takes
    the single-row path. Returns one ``(entry, logits (V,))`` per item, in order.
    """
    order = sorted(range(len(items)), key=lambda i: items[i].new)
    chunks: list[list[int]] = []
    for i in order:
        n = items[i].new
        chunk = chunks[-1] if chunks else None
        if chunk is None or n > 2 * items[chunk[0]].new + 32 or (len(chunk) + 1) * n > token_budget:
            chunks.append([i])
        else:
            chunk.append(i)
    results: list[tuple[Entry, torch.Tensor] | None] = [None] * len(items)
    for chunk in chunks:
        if len(chunk) == 1:
            it = items[chunk[0]]
            results[chunk[0]] = prefill(model, shape, it.tokens, it.entry, it.reuse)
            continue
        for i, out in zip(chunk, prefill_padded(model, shape, [items[i] for i in chunk])):
            results[i] = out
    return [r for r in results if r is not None]


def prefill_padded(model: Model, shape: KVShape, items: list[PrefillItem]) -> list[tuple[Entry, torch.Tensor]]:
    """Prefill several rows in one forward over their cached prefixes (each row's own length).

    Layout of the (B, H, P + Q, D) buffers, P = longest reused prefix, Q = most new tokens: row i's
    reused key/values are right-aligned in ``[P - r_i, P)`` and its n_i new tokens in
    ``[P + Q - n_i, P + Q)``; the gaps are padding. A 4-D boolean mask (B, 1, Q, P + Q) lets each
    new token see its own prefix and its own earlier new tokens only; a padding query sees just
    itself, so no row of the mask is empty (an empty row makes SDPA return NaN, which would then
    reach the padding keys). Keys sit at their true RoPE positions, as in :func:`prefill`.
    """
    b = len(items)
    reuse = [it.reuse if it.entry is not None else 0 for it in items]
    new = [len(it.tokens) - r for it, r in zip(items, reuse)]
    p, q = max(reuse), max(new)
    keys, values = shape.buffers(b, p + q)
    input_ids = torch.zeros(b, q, dtype=torch.long)
    positions = torch.zeros(b, q, dtype=torch.long)
    allowed = torch.zeros(b, 1, q, p + q, dtype=torch.bool)
    diag = torch.arange(q)
    allowed[:, 0, diag, p + diag] = True  # every query sees itself (padding queries only that)
    for i, (it, r, n) in enumerate(zip(items, reuse, new)):
        if r:
            for k, v, ek, ev in zip(keys, values, it.entry.keys, it.entry.values):
                k[i, :, p - r:p] = ek[:, :r]
                v[i, :, p - r:p] = ev[:, :r]
        input_ids[i, q - n:] = torch.tensor(it.tokens[r:])
        positions[i, q - n:] = torch.arange(r, r + n)
        allowed[i, 0, q - n:, p - r:p] = True
        allowed[i, 0, q - n:, p + q - n:] = torch.ones(n, n, dtype=torch.bool).tril()
    cache = Cache(layers=[BufferLayer(k, v, p) for k, v in zip(keys, values)])
    out = model(input_ids=input_ids, attention_mask=allowed, position_ids=positions, past_key_values=cache,
                use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float()
    results = []
    for i, (it, r, n) in enumerate(zip(items, reuse, new)):
        row_k = [torch.cat([k[i, :, p - r:p], k[i, :, p + q - n:]], dim=1) for k in keys]
        row_v = [torch.cat([v[i, :, p - r:p], v[i, :, p + q - n:]], dim=1) for v in values]
        results.append((Entry(torch.tensor(it.tokens, dtype=torch.long), row_k, row_v), logits[i]))
    return results


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # per row, up to and including its stop id
    logprobs: list[list[float]]
    stopped: list[bool]  # True = a stop id ended the row, False = its max_tokens did
    entries: list[Entry]  # per row: context + generated tokens whose key/values were computed


def decode(model: Model, shape: KVShape, rows: list[Entry], first_logits: torch.Tensor, max_tokens: list[int],
           choose: Callable[[torch.Tensor], torch.Tensor], logprob_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           stop_ids: set[int], pad_id: int) -> DecodeResult:
    """Decode all ``rows`` together over one left-padded cache.

    ``first_logits`` (B, V) are the rows' next-token logits from :func:`prefill`; ``choose`` maps
    logits (B, V) to tokens (B,), ``logprob_of`` maps (logits, tokens) to log-probs (B,).
    """
    b, width, steps = len(rows), max(len(r) for r in rows), max(max_tokens)
    keys, values = shape.buffers(b, width + steps)
    mask = torch.zeros(b, width + steps, dtype=torch.long)
    for i, row in enumerate(rows):
        start = width - len(row)
        for k, v, rk, rv in zip(keys, values, row.keys, row.values):
            k[i, :, start:width] = rk
            v[i, :, start:width] = rv
        mask[i, start:width] = 1
    cache = Cache(layers=[BufferLayer(k, v, width) for k, v in zip(keys, values)])
    positions = torch.tensor([[len(r)] for r in rows])
    stop = torch.tensor(sorted(stop_ids))
    limits = torch.tensor(max_tokens)
    done = torch.zeros(b, dtype=torch.bool)
    out_tokens, out_lp, logits = [], [], first_logits
    for t in range(steps):
        tok = choose(logits)
        out_lp.append(logprob_of(logits, tok))
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        out_tokens.append(tok)
        done = done | torch.isin(tok, stop) | (limits <= t + 1)
        if bool(done.all()):
            break
        mask[:, width + t] = 1
        out = model(input_ids=tok[:, None], attention_mask=mask[:, : width + t + 1], position_ids=positions,
                    past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1].float()
        positions = positions + 1
    return _split_rows(rows, keys, values, width, torch.stack(out_tokens, 1), torch.stack(out_lp, 1),
                       max_tokens, stop_ids, computed=len(out_tokens) - 1)


def _split_rows(rows: list[Entry], keys: list[torch.Tensor], values: list[torch.Tensor], width: int,
                tokens: torch.Tensor, logprobs: torch.Tensor, max_tokens: list[int], stop_ids: set[int],
                computed: int) -> DecodeResult:
    """Cut each row at its stop id or limit; ``computed`` generated positions have key/values."""
    result = DecodeResult([], [], [], [])
    for i, row in enumerate(rows):
        seq = tokens[i].tolist()[: max_tokens[i]]
        end = next((j + 1 for j, t in enumerate(seq) if t in stop_ids), None)
        seq = seq[:end] if end is not None else seq
        result.tokens.append(seq)
        result.logprobs.append(logprobs[i, : len(seq)].tolist())
        result.stopped.append(end is not None)
        kept = min(len(seq) - 1, computed)  # the last token was sampled but never fed back
        start, stop_col = width - len(row), width + kept
        ids = torch.cat([row.tokens, torch.tensor(seq[:kept], dtype=torch.long)])
        result.entries.append(Entry(ids, [k[i, :, start:stop_col].clone() for k in keys],
                                    [v[i, :, start:stop_col].clone() for v in values]))
    return result
