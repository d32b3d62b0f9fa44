"""Prefix KV reuse for the HF server: the store of past key/values and the cache's building blocks.

On CPU the cost of an episode's LLM call is dominated by re-reading its whole context (a BFCL
prompt is 3.5k-7k tokens) when only the last observation is new. The server therefore keeps the
key/value tensors of recent contexts in a :class:`PrefixStore`; a request reuses the longest stored
prefix it shares (the same episode's previous call, or a sibling episode of the same task) and
computes only the rest (:mod:`seal.engine.kv_engine`). Entries are chains (:class:`Entry`), so
an extension stores only what it adds. :class:`BufferLayer` is the cache layer the engine runs
the model over: preallocated buffers, so no step copies the cache. The models it works with:
:mod:`seal.engine.kv_engine`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicLayer


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
    device: torch.device = torch.device("cpu")

    @classmethod
    def of(cls, config: object, dtype: torch.dtype, device: torch.device | str = "cpu") -> KVShape:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, heads, head_dim, dtype, torch.device(device))

    def buffers(self, batch: int, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (batch, self.heads, capacity, self.head_dim)
        return ([torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)],
                [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)])


@dataclass(eq=False)  # identity: entries hold tensors
class Entry:
    """Key/values of the context ``tokens`` (n,), stored as a chain that shares storage.

    The entry holds positions ``[start, n)`` (per layer (H, n - start, D)); ``parent`` holds
    ``[0, start)`` (its first ``start`` tokens equal ours). A context that extends a stored one
    (the next call of an episode, a sibling episode of the same task) therefore keeps only what it
    adds, and n sibling episodes hold their common prompt once. The chain's ``root`` (no parent)
    is the first context computed from scratch: in an episode, the prompt.
    """

    tokens: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    parent: Entry | None = None
    start: int = 0
    stamp: int = 0

    def __post_init__(self) -> None:
        if (self.parent is None) != (self.start == 0) or (self.parent is not None and self.start > len(self.parent)):
            raise ValueError(f"entry start {self.start} does not fit its parent")
        if self.keys and int(self.keys[0].shape[1]) != len(self) - self.start:
            raise ValueError(f"entry holds {int(self.keys[0].shape[1])} positions, expected {len(self) - self.start}")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def root_span(self) -> tuple[Entry, int]:
        """The chain's root and how many of its leading positions belong to this context (a link
        vouches only for its parent's first ``start`` tokens)."""
        entry, n = self, len(self)
        while entry.parent is not None:
            n = min(n, entry.start)
            entry = entry.parent
        return entry, n

    def pieces(self, lo: int, hi: int) -> list[tuple[int, list[torch.Tensor], list[torch.Tensor]]]:
        """Views covering positions ``[lo, hi)`` in order: ``(first position, keys, values)``,
        per layer (H, piece length, D)."""
        out = []
        entry: Entry | None = self
        while entry is not None and hi > lo:
            a = max(lo, entry.start)
            if hi > a:
                i, j = a - entry.start, hi - entry.start
                out.append((a, [k[:, i:j] for k in entry.keys], [v[:, i:j] for v in entry.values]))
            hi = min(hi, entry.start)
            entry = entry.parent
        return out[::-1]

    def write(self, keys: list[torch.Tensor], values: list[torch.Tensor], row: int, dst: int, lo: int, hi: int
              ) -> None:
        """Copy positions ``[lo, hi)`` into row ``row`` of (B, H, capacity, D) buffers from ``dst`` on."""
        for pos, piece_k, piece_v in self.pieces(lo, hi):
            at, n = dst + pos - lo, int(piece_k[0].shape[1])
            for k, v, pk, pv in zip(keys, values, piece_k, piece_v):
                k[row, :, at:at + n] = pk
                v[row, :, at:at + n] = pv

    def materialize(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """All positions as contiguous per-layer (H, n, D) copies (for checks, not the hot path)."""
        pieces = self.pieces(0, len(self))
        layers = range(len(self.keys))
        return ([torch.cat([p[1][i] for p in pieces], dim=1) for i in layers],
                [torch.cat([p[2][i] for p in pieces], dim=1) for i in layers])


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


@dataclass
class PrefixStore:
    """Least-recently-used store of contexts' key/values, at most ``max_tokens`` positions in all.

    The bound counts every entry's whole context, although chained entries share their common
    part, so it overstates memory: a safe limit. An evicted entry's storage lives on while a stored
    extension of it points at it (it is part of that extension's context).
    """

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
