"""Prompt-lookup speculative decoding for the cached engine: exact, no draft model.

Each step, every row drafts up to ``max_draft`` tokens by prompt lookup in its own context and
generated text (:class:`~seal.engine.ngram.NgramIndex`), and one forward verifies them all: row i
feeds ``[last token, d1 .. dn_i]`` (rows with shorter drafts padded; a row without a draft feeds its
one token), and keeps the longest prefix of the draft the target agrees with plus one token of the
target's own. On a small model on a CPU a forward costs mostly its weight reads and per-op
overhead, so verifying a few positions costs little more than decoding one, and every accepted
draft token is a step saved.

**Exactness.** Greedy: a draft token is accepted iff it is the argmax at its position, and the
token after the accepted prefix is the argmax there, so the tokens are those of plain greedy
decoding (log-probs equal to float rounding of the logits). Sampled: :mod:`seal.engine.sampling`
draws every token by the inverse CDF with the row's prompt-lookup prediction ordered first, one
uniform per token; for a drafted position the prediction *is* the draft, so accepting iff
``u < p(d)`` and otherwise drawing from ``p`` without ``d`` renormalised is standard speculative
sampling with a deterministic proposal, and after a fully accepted draft the next token is drawn
from ``p`` at the next position. The output distribution is the target's; more, a row's tokens
are those plain decoding draws from the same stream (its own generator: a seeded request's answer
does not depend on speculation, draft length or batch-mates).

**Layout.** Rows' lengths diverge (each accepts its own count), so the cache is right-ragged:
row i holds its own context in buffer columns ``[start_i, width)`` (left padding before it, as in
:func:`~seal.engine.kv_engine.decode`) and its generated positions from ``width`` on, contiguous
up to ``ptr_i`` (the column of the token it feeds next). A step writes each row's Q fed positions
at ``ptr_i .. ptr_i + Q - 1`` (:class:`RaggedLayer`: one scatter per layer), the 4-D mask lets query
j of row i see ``[start_i, ptr_i + j]``, RoPE positions are each row's true ones, and ``ptr_i``
then advances by the accepted count plus one: rejected and padding columns lie past it and are
overwritten by the next step before any mask shows them. Prefix groups (shared-prompt attention)
and dropping finished rows work as in plain decoding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

from seal.engine.attention import PREFIX_KWARG, PrefixGroup
from seal.engine.draft_policy import DraftPolicy, row_state
from seal.engine.kv_cache import Entry, KVShape
from seal.engine.kv_engine import (DEFAULT_MIN_SHARED, DROP_FINISHED_SHARE, DecodeResult, Model, _finish_row,
                                   _keep_group_rows, prefix_groups)
from seal.engine.ngram import MIN_NGRAM, NgramIndex
from seal.engine.sampling import NO_HINT, SamplingKey, hint_mass, hinted_draw, row_uniform, target_probs

log = logging.getLogger(__name__)

LogProbOf = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SpeculativeSettings:
    """``enable``: speculate at all; ``max_draft``: most tokens drafted per row and step (k);
    ``ngram``: the longest n-gram looked up (then shorter ones down to 2). ``ngram`` also orders
    every sampled draw (:mod:`seal.engine.sampling`), speculating or not."""

    enable: bool = True
    max_draft: int = 6
    ngram: int = 3

    @classmethod
    def from_config(cls, cfg: object) -> SpeculativeSettings:
        """``seal.local.speculative`` of an experiment config (a missing key takes its schema default)."""
        from seal.schema import SpeculativeKeys, block

        keys = block(SpeculativeKeys, cfg, "seal.local.speculative")
        return cls(enable=bool(keys.enable), max_draft=int(keys.max_draft), ngram=int(keys.ngram))

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise ValueError(f"speculative max_draft must be >= 1, got {self.max_draft}")
        if self.ngram < MIN_NGRAM:
            raise ValueError(f"speculative ngram must be >= {MIN_NGRAM}, got {self.ngram}")


class RaggedLayer(DynamicLayer):
    """A cache layer over preallocated (B, H, capacity, D) buffers that writes each row's new
    positions at that row's own columns (``cols`` (B, Q)) and shows the first ``extent`` columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, cols: torch.Tensor, extent: int) -> None:
        super().__init__()
        self._kbuf, self._vbuf, self._cols, self._extent = keys, values, cols, extent
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.keys, self.values = keys[..., :extent, :], values[..., :extent, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        index = self._cols[:, None, :, None].expand_as(key_states)
        self._kbuf.scatter_(2, index, key_states.to(self.dtype))
        self._vbuf.scatter_(2, index, value_states.to(self.dtype))
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._extent


@dataclass
class _Row:
    """One request's decoding state (indexed by its position in the ``rows`` given to :func:`decode`)."""

    index: NgramIndex
    limit: int
    stream: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    state: str = "start"  # how its previous step went (seal.engine.draft_policy)


@dataclass
class _Plan:
    """A step's input: per batch row its drafts and the prediction after them (sampling's hint)."""

    drafts: list[list[int]]
    bonus_hints: list[int]

    @property
    def width(self) -> int:
        return 1 + max((len(d) for d in self.drafts), default=0)


@dataclass
class _Batch:
    """The rows still in the decode batch: buffers and per batch row tensors (see the module docstring)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    start: torch.Tensor
    ptr: torch.Tensor
    pos: torch.Tensor
    active: list[int]
    last: list[int]
    groups: list[PrefixGroup]


def decode(model: Model, shape: KVShape, rows: list[Entry], first_logits: torch.Tensor, max_tokens: list[int],
           key: SamplingKey, streams: Sequence[torch.Generator] | None, logprob_of: LogProbOf, stop_ids: set[int],
           pad_id: int, settings: SpeculativeSettings, min_shared: int = DEFAULT_MIN_SHARED,
           policy: DraftPolicy | None = None) -> DecodeResult:
    """Decode ``rows`` together with prompt-lookup speculation; the contract of
    :func:`seal.engine.kv_engine.decode`, with the token choice given as ``key`` (greedy when its
    temperature is 0) and ``streams``, one generator per row (sampled only): every sampled token
    of row i is one :func:`~seal.engine.sampling.row_uniform` of ``streams[i]``. ``policy`` picks
    each step's width and learns from it (:mod:`seal.engine.draft_policy`; a server keeps one
    across batches); it changes the speed, never the tokens.
    """
    policy = policy if policy is not None else DraftPolicy()
    groups, shared = prefix_groups(model, [r.tokens for r in rows], list(rows), [len(r) for r in rows], min_shared)
    b, q_max = len(rows), settings.max_draft + 1
    width = max(len(r) - s for r, s in zip(rows, shared))
    keys, values = shape.buffers(b, width + max(max_tokens) + q_max)
    for i, (row, s) in enumerate(zip(rows, shared)):
        row.write(keys, values, i, width - (len(row) - s), s, len(row))
    dev = shape.device
    start = torch.tensor([width - (len(r) - s) for r, s in zip(rows, shared)], device=dev)
    state = [_Row(NgramIndex(r.tokens.tolist(), settings.ngram), m, streams[i] if streams is not None else None)
             for i, (r, m) in enumerate(zip(rows, max_tokens))]
    result = DecodeResult([], [], [], [])
    firsts = _first_tokens(first_logits, state, key, logprob_of)
    for row, (tok, lp) in zip(state, firsts):
        _commit(row, [tok], [lp], stop_ids)
    batch = _Batch(keys, values, start, torch.full((b,), width, device=dev), torch.tensor([len(r) for r in rows],
                   device=dev), list(range(b)), [t for t, _ in firsts], groups)
    finished: list[tuple[list[int], list[float], bool, Entry] | None] = [None] * b
    result.steps, result.row_steps = 1, b
    while not all(state[i].done for i in batch.active):
        done = [j for j, i in enumerate(batch.active) if state[i].done]
        if done and len(done) >= DROP_FINISHED_SHARE * len(batch.active):
            batch = _drop_rows(batch, done, rows, state, max_tokens, stop_ids, width, finished)
        plan = _plan(batch, state, settings, policy, sampled=key.temperature > 0)
        started = time.perf_counter()
        logits = _verify(model, batch, plan, pad_id)
        accepted = _decide(logits, batch, plan, state, key, logprob_of, stop_ids)
        policy.observe_step(len(batch.active) * plan.width, time.perf_counter() - started)
        for i, draft, a in zip(batch.active, plan.drafts, accepted):
            if a is not None:
                policy.observe_drafts(state[i].state, len(draft), a)
                state[i].state = row_state(len(draft), a)
        # A row live at this step moves past its fed and accepted positions (even if it just
        # finished: later steps must not overwrite what its entry keeps); a finished row stays put.
        advance = torch.tensor([0 if a is None else a + 1 for a in accepted], device=dev)
        batch.ptr, batch.pos = batch.ptr + advance, batch.pos + advance
        result.steps, result.row_steps = result.steps + 1, result.row_steps + len(batch.active)
        result.drafted += sum(len(d) for d in plan.drafts)
        result.accepted += sum(a for a in accepted if a is not None)
    for j, i in enumerate(batch.active):
        finished[i] = _finish(rows[i], state[i], max_tokens[i], stop_ids, batch, j, width)
    result.tokens, result.logprobs, result.stopped, result.entries = map(list, zip(*finished))
    log.debug("speculative decode: %d rows, %d steps, %d drafted, %d accepted", b, result.steps,
              result.drafted, result.accepted)
    return result


def _first_tokens(logits: torch.Tensor, state: list[_Row], key: SamplingKey, logprob_of: LogProbOf
                  ) -> list[tuple[int, float]]:
    """Each row's first token from its prefill logits (B, V), with its log-prob."""
    if key.temperature <= 0:
        tokens = logits.argmax(dim=-1)
    else:
        hints = torch.tensor([row.index.hint() for row in state], device=logits.device)
        u = torch.tensor([row_uniform(row.stream) for row in state], dtype=torch.float64)
        tokens = hinted_draw(target_probs(logits, key), hints, u)
    return list(zip(tokens.tolist(), logprob_of(logits, tokens).tolist()))


def _commit(row: _Row, new: list[int], logprobs: list[float], stop_ids: set[int]) -> int:
    """Append a step's ``new`` tokens to ``row`` up to its first stop id (kept) or its limit;
    the rest (accepted draft tokens past a stop) is discarded. Returns how many were kept."""
    kept = 0
    for tok, lp in zip(new, logprobs):
        row.tokens.append(tok)
        row.logprobs.append(lp)
        kept += 1
        if tok in stop_ids or len(row.tokens) >= row.limit:
            row.done = True
            return kept
    row.index.extend(new)
    return kept


def _plan(batch: _Batch, state: list[_Row], settings: SpeculativeSettings, policy: DraftPolicy, sampled: bool
          ) -> _Plan:
    """Each live row's draft: its prompt-lookup prediction, at most ``max_draft`` tokens, one fewer
    than its remaining budget (the target adds a token to every step) and at most the step's
    width less one (:meth:`DraftPolicy.width`). A sampled row also needs the prediction after its
    draft: the hint of the token drawn when all of it is accepted."""
    preds, offered, states = [], [], []
    for i in batch.active:
        row = state[i]
        cap = 0 if row.done else min(settings.max_draft, row.limit - len(row.tokens) - 1)
        pred = row.index.predict(cap + 1 if sampled else cap) if not row.done and (cap > 0 or sampled) else []
        preds.append(pred)
        if not row.done:
            offered.append(min(len(pred), cap))
            states.append(row.state)
    width = policy.width(offered, states, len(batch.active))
    drafts, bonus = [], []
    for i, pred in zip(batch.active, preds):
        row = state[i]
        n = 0 if row.done else min(len(pred), width - 1, settings.max_draft, row.limit - len(row.tokens) - 1)
        drafts.append(pred[:n])
        bonus.append(pred[n] if len(pred) > n and not row.done else NO_HINT)
    return _Plan(drafts, bonus)


def _verify(model: Model, batch: _Batch, plan: _Plan, pad_id: int) -> torch.Tensor:
    """One forward over every row's ``[last token, draft..]``: logits (B, Q, V), float32."""
    b, q = len(batch.active), plan.width
    dev = batch.ptr.device
    ids = torch.full((b, q), pad_id, dtype=torch.long)
    for j, (last, draft) in enumerate(zip(batch.last, plan.drafts)):
        ids[j, 0] = last
        if draft:
            ids[j, 1:1 + len(draft)] = torch.tensor(draft)
    offsets = torch.arange(q, device=dev)
    cols = batch.ptr[:, None] + offsets
    extent = int(batch.ptr.max()) + q
    seen = torch.arange(extent, device=dev)
    allowed = (seen >= batch.start[:, None, None]) & (seen <= cols[:, :, None])  # (B, Q, extent)
    cache = Cache(layers=[RaggedLayer(k, v, cols, extent) for k, v in zip(batch.keys, batch.values)])
    extra = {PREFIX_KWARG: batch.groups} if batch.groups else {}
    out = model(input_ids=ids.to(dev), attention_mask=allowed[:, None], position_ids=batch.pos[:, None] + offsets,
                past_key_values=cache, use_cache=True, **extra)
    return out.logits.float()


def _decide(logits: torch.Tensor, batch: _Batch, plan: _Plan, state: list[_Row], key: SamplingKey,
            logprob_of: LogProbOf, stop_ids: set[int]) -> list[int | None]:
    """Accept each live row's longest agreed draft prefix plus the target's next token, commit
    them (:func:`_commit`) and set the row's next fed token. Returns the accepted draft count per
    batch row (``None`` for a row that had finished before this step)."""
    live = [j for j, i in enumerate(batch.active) if not state[i].done]
    if key.temperature <= 0:
        chosen = _greedy(logits, plan, live)
    else:
        chosen = _sampled(logits, plan, live, [state[batch.active[j]].stream for j in live], key)
    flat_rows = [j for j, toks in zip(live, chosen) for _ in toks]
    flat_pos = [p for toks in chosen for p in range(len(toks))]
    flat_tok = torch.tensor([t for toks in chosen for t in toks], device=logits.device)
    lps = logprob_of(logits[flat_rows, flat_pos], flat_tok).tolist() if flat_rows else []
    accepted: list[int | None] = [None] * len(batch.active)
    at = 0
    for j, toks in zip(live, chosen):
        _commit(state[batch.active[j]], toks, lps[at:at + len(toks)], stop_ids)
        at += len(toks)
        accepted[j], batch.last[j] = len(toks) - 1, toks[-1]
    return accepted


def _greedy(logits: torch.Tensor, plan: _Plan, live: list[int]) -> list[list[int]]:
    """Per live row, the accepted draft tokens and the argmax after them (all argmaxes)."""
    best = logits.argmax(dim=-1)  # (B, Q)
    q = logits.shape[1]
    if q == 1:
        return [[t] for t in best[live, 0].tolist()]
    draft = torch.full((logits.shape[0], q - 1), -1, dtype=torch.long, device=logits.device)
    for j, d in enumerate(plan.drafts):
        if d:
            draft[j, :len(d)] = torch.tensor(d)
    agreed = (best[:, :-1] == draft).long().cumprod(dim=1).sum(dim=1).tolist()
    rows = best.tolist()
    return [rows[j][:agreed[j] + 1] for j in live]


def _sampled(logits: torch.Tensor, plan: _Plan, live: list[int], streams: list[torch.Generator],
             key: SamplingKey) -> list[list[int]]:
    """Per live row, the accepted draft tokens and the target's token after them (module docstring).

    Every position a row may use (its draft's and the one after) gets the target's distribution;
    the row then draws one uniform per position in order: a drafted position accepts its draft
    iff ``u * total < p(d)`` (:func:`~seal.engine.sampling.hint_mass`), the first rejection or the
    position after the draft draws by :func:`~seal.engine.sampling.hinted_draw` with that same
    uniform, which for a rejected draft can only give another token.
    """
    flat_rows = [j for j in live for _ in range(len(plan.drafts[j]) + 1)]
    flat_pos = [p for j in live for p in range(len(plan.drafts[j]) + 1)]
    hints = torch.tensor([h for j in live for h in plan.drafts[j] + [plan.bonus_hints[j]]], device=logits.device)
    probs = target_probs(logits[flat_rows, flat_pos], key)
    ph, total = hint_mass(probs, hints)
    ph_list, total_list = ph.tolist(), total.tolist()
    finals, uniforms, heads = [], [], []
    at = 0
    for j, stream in zip(live, streams):
        n = len(plan.drafts[j])
        agreed = n
        u = 0.0
        for p in range(n + 1):
            u = row_uniform(stream)
            if p == n or not _accepts(u, ph_list[at + p], total_list[at + p]):
                agreed = p
                break
        finals.append(at + agreed)
        uniforms.append(u)
        heads.append(plan.drafts[j][:agreed])
        at += n + 1
    index = torch.tensor(finals, device=logits.device)
    last = hinted_draw(probs[index], hints[index], torch.tensor(uniforms, dtype=torch.float64),
                       (ph[index], total[index])).tolist()
    return [head + [tok] for head, tok in zip(heads, last)]


def _accepts(u: float, p_draft: float, total: float) -> bool:
    """Whether uniform ``u`` accepts a draft the target gives ``p_draft`` of ``total`` mass: the
    first stretch of :func:`~seal.engine.sampling.hinted_draw`'s inverse CDF (same float64 sums)."""
    return u * total < p_draft


def _drop_rows(batch: _Batch, done: list[int], rows: list[Entry], state: list[_Row], max_tokens: list[int],
               stop_ids: set[int], width: int, finished: list) -> _Batch:
    """Finish the batch rows ``done`` and cut the buffers to the others (as plain decoding does)."""
    for j in done:
        i = batch.active[j]
        finished[i] = _finish(rows[i], state[i], max_tokens[i], stop_ids, batch, j, width)
    keep_list = [j for j in range(len(batch.active)) if j not in set(done)]
    keep = torch.tensor(keep_list, device=batch.ptr.device)
    # Whole rows are copied, not just the columns before the furthest ``ptr`` as plain decoding
    # does: a row behind the furthest one still shows columns past its own writes to the attention
    # kernel (masked, but multiplied by zero weights, and uninitialised memory may hold NaN).
    return _Batch([k.index_select(0, keep) for k in batch.keys], [v.index_select(0, keep) for v in batch.values],
                  batch.start[keep],
                  batch.ptr[keep], batch.pos[keep], [batch.active[j] for j in keep_list],
                  [batch.last[j] for j in keep_list], _keep_group_rows(batch.groups, keep, len(batch.active)))


def _finish(row: Entry, st: _Row, max_tokens: int, stop_ids: set[int], batch: _Batch, j: int, width: int
            ) -> tuple[list[int], list[float], bool, Entry]:
    """:func:`~seal.engine.kv_engine._finish_row` for batch row ``j``: its generated positions sit
    contiguous from column ``width``, as in plain decoding."""
    return _finish_row(row, torch.tensor(st.tokens, dtype=torch.long), torch.tensor(st.logprobs), max_tokens,
                       stop_ids, batch.keys, batch.values, j, width)
