"""The HF server's cached engine: prefill past stored prefixes, then decode a batch together.

A request's context is prefilled past the longest prefix the :class:`~seal.engine.kv_cache.PrefixStore`
holds (:func:`prefill_many`: rows with similar new-token counts in one padded forward), then the
rows of a batch decode together (:func:`decode`). Rows whose contexts start alike (the n episodes
of one task share a prompt of thousands of tokens) form a
:class:`~seal.engine.attention.PrefixGroup`: that prefix is kept out of the per-row buffers and
read once per forward for all of them (shared-prefix attention), in prefill and in decode. A row's
own buffer holds only the rest of its context and its new tokens.

Works with decoder-only models whose attention uses a standard per-layer key/value cache and
explicit ``position_ids`` (Llama, Mistral, Qwen2 families). Keys are cached after RoPE at their
true positions, which left padding preserves (positions count real tokens only). Every layer must
be plain full causal attention: the engine builds its own masks (a new token sees every earlier
one) and reads a shared prefix without any mask, so a sliding window, logit softcapping or a
non-softmax layer would be silently ignored. :func:`check_model` refuses such a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from seal.config_base import ConfigError
from seal.engine.attention import PREFIX_KWARG, PrefixGroup, prefix_groups_supported
from seal.engine.kv_cache import BufferLayer, Entry, KVShape, common_prefix
from seal.engine.ngram import NgramIndex

# Rows sharing at least this many leading tokens attend to them as one shared prefix.
DEFAULT_MIN_SHARED = 128

# Model types whose attention this engine implements: every layer softmax attention over a
# per-layer key/value cache with RoPE at ``position_ids``, one head size for keys and values,
# nothing applied to the scores but the mask. Each is held to ``model.generate`` by a test on a
# tiny random model (tests/seal/engine/test_engine_model_support.py). The configs' own switches
# (sliding windows, layer types, softcapping) are checked on top of this list.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")
FULL_ATTENTION = "full_attention"
MODEL_KEY = "actor_rollout_ref.model.path"

Model = Callable[..., object]


def unsupported_attention(config: object) -> str | None:
    """What of ``config``'s attention the engine does not implement, in words; ``None`` if nothing.

    Checked in this order, so the reason named is the most specific one: per-layer ``layer_types``
    other than full attention (Gemma 2/3 sliding layers, chunked or linear attention), a
    ``sliding_window`` narrower than the model's context where the model has no ``layer_types``
    (Mistral v0.1, Phi-3-4k apply it to every layer), attention logit softcapping, ALiBi, and
    finally a model type outside :data:`SUPPORTED_MODEL_TYPES`. A window at least as wide as the
    context (``max_position_embeddings``) never masks anything and is accepted.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = str(getattr(config, "model_type", "") or getattr(text, "model_type", "") or "unknown")
    layer_types = list(getattr(text, "layer_types", None) or [])
    window = getattr(text, "sliding_window", None)
    context = int(getattr(text, "max_position_embeddings", 0) or 0)
    other = sorted({str(t) for t in layer_types} - {FULL_ATTENTION})
    if other:
        shown = ", ".join(repr(t) for t in other)
        width = f", sliding_window={window}" if window and "sliding_attention" in other else ""
        return f"layers of type {shown} (config.layer_types{width})"
    if not layer_types and window and (not context or int(window) < context):
        return f"sliding-window attention (config.sliding_window={window} < its {context or '?'}-token context)"
    if getattr(text, "attn_logit_softcapping", None):
        return f"attention logit softcapping (config.attn_logit_softcapping={text.attn_logit_softcapping})"
    if getattr(text, "alibi", False) or getattr(text, "position_embedding_type", None) == "alibi":
        return "ALiBi position biases"
    if model_type not in SUPPORTED_MODEL_TYPES and getattr(text, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"an architecture outside those the engine implements ({', '.join(SUPPORTED_MODEL_TYPES)})"
    return None


def check_model(model: torch.nn.Module) -> None:
    """Refuse, with one :class:`~seal.config.ConfigError` line, a model whose attention the engine
    would compute differently from the model itself (see :func:`unsupported_attention`).

    Without this check such a model generates: its outputs match ``model.generate`` on short
    prompts and turn to garbage past the window (Gemma 3 with prompts over 512 tokens).
    """
    config = model.config
    reason = unsupported_attention(config)
    if reason is None:
        return
    path = str(getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", "") or "")
    key = f"{MODEL_KEY}={path}" if path else MODEL_KEY
    model_type = getattr(config, "model_type", None) or "unknown"
    raise ConfigError(
        f"{key}: model type {model_type!r} has {reason}, but the local generation engine (seal.engine) "
        "implements only full causal attention; use a model with full causal attention (llama, qwen2, "
        "qwen3, mistral without a sliding window) or trainer.backend=verl with vLLM on a GPU")


def group_rows(contexts: list[torch.Tensor], usable: list[int], min_shared: int) -> list[tuple[list[int], int]]:
    """Rows that share a long prefix: ``[(rows, length), ...]``, first row first.

    Row i may share at most its first ``usable[i]`` tokens. Each row joins the group where that
    pays most: sharing ``m`` tokens saves the joiner ``m`` positions per forward, and shrinking a
    group of ``n`` rows from ``L`` to ``m`` costs ``n * (L - m)``; it joins only when the gain is
    positive and ``m >= min_shared``, else it starts a group of its own (a group of one still
    spares copying its prefix into the batch's buffers). Rows with ``usable < min_shared`` are in
    no group; ``min_shared <= 0`` turns grouping off.
    """
    groups: list[tuple[list[int], int]] = []
    for i, ctx in enumerate(contexts):
        if min_shared <= 0 or usable[i] < min_shared:
            continue
        best, best_gain, best_len = None, 0, 0
        for gi, (rows, length) in enumerate(groups):
            m = min(common_prefix(contexts[rows[0]], ctx), usable[i], length)
            gain = m - len(rows) * (length - m)
            if m >= min_shared and gain > best_gain:
                best, best_gain, best_len = gi, gain, m
        if best is None:
            groups.append(([i], usable[i]))
        else:
            groups[best] = (groups[best][0] + [i], best_len)
    return groups


def prefix_groups(model: Model, contexts: list[torch.Tensor], entries: list[Entry | None], usable: list[int],
                  min_shared: int) -> tuple[list[PrefixGroup], list[int]]:
    """:func:`group_rows` as attention inputs, plus each row's shared length (0 = in no group).

    A row can share only positions its ``entries[i]`` holds in the chain's root (one contiguous
    tensor, so a group's prefix is a view and one kernel call per layer). The group's key/values
    are views of its first row's root; the other rows hold the same tokens (a common prefix),
    computed by the same weights. No groups unless the model runs the server attention on CPU.
    """
    shared = [0] * len(contexts)
    if not prefix_groups_supported(model):
        return [], shared
    spans = [e.root_span() if e is not None else (None, 0) for e in entries]
    limit = [min(u, n) for u, (_, n) in zip(usable, spans)]
    groups = []
    for rows, length in group_rows(contexts, limit, min_shared):
        root = spans[rows[0]][0]
        groups.append(PrefixGroup(torch.tensor(rows, device=root.keys[0].device), [k[:, :length] for k in root.keys],
                                  [v[:, :length] for v in root.values]))
        for i in rows:
            shared[i] = length
    return groups, shared


@dataclass(frozen=True)
class PrefillItem:
    """One context to prefill: its ``tokens`` and the stored ``entry`` whose first ``reuse`` match."""

    tokens: list[int]
    entry: Entry | None
    reuse: int

    @property
    def new(self) -> int:
        return len(self.tokens) - (self.reuse if self.entry is not None else 0)


def prefill_many(model: Model, shape: KVShape, items: list[PrefillItem], token_budget: int = 4096,
                 min_shared: int = DEFAULT_MIN_SHARED) -> list[tuple[Entry, torch.Tensor]]:
    """:func:`prefill_padded` for many contexts, rows with similar new-token counts in one forward.

    Rows are sorted by how many tokens they add and cut into chunks whose longest row is at most
    twice the shortest (plus 32), so padding wastes little, and whose padded size (rows x longest)
    stays within ``token_budget`` (the attention scores grow with it). Returns one
    ``(entry, logits (V,))`` per item, in order.
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
        for i, out in zip(chunk, prefill_padded(model, shape, [items[i] for i in chunk], min_shared)):
            results[i] = out
    return [r for r in results if r is not None]


def prefill_padded(model: Model, shape: KVShape, items: list[PrefillItem], min_shared: int = DEFAULT_MIN_SHARED
                   ) -> list[tuple[Entry, torch.Tensor]]:
    """Prefill several rows in one forward over their cached prefixes (each row's own length).

    Rows whose reused prefixes share at least ``min_shared`` tokens attend to that part as a
    :class:`~seal.engine.attention.PrefixGroup` (see :func:`prefix_groups`); the rest of row i's
    reused prefix, its "own" part of ``o_i`` positions, goes in the buffers. Layout of the
    (B, H, P + Q, D) buffers, P = longest own part, Q = most new tokens: row i's own part is
    right-aligned in ``[P - o_i, P)`` and its n_i new tokens in ``[P + Q - n_i, P + Q)``; the gaps
    are padding. A 4-D boolean mask (B, 1, Q, P + Q) lets each new token see its own part and its
    own earlier new tokens only; a padding query sees just itself, so no row of the mask is empty
    (an empty row makes SDPA return NaN, which would then reach the padding keys). Keys sit at
    their true RoPE positions. Each returned entry extends the one it reused (a chain link
    holding the new tokens only).
    """
    b = len(items)
    reuse = [it.reuse if it.entry is not None else 0 for it in items]
    new = [len(it.tokens) - r for it, r in zip(items, reuse)]
    contexts = [torch.tensor(it.tokens[:r], dtype=torch.long) for it, r in zip(items, reuse)]
    groups, shared = prefix_groups(model, contexts, [it.entry for it in items], reuse, min_shared)
    own = [r - s for r, s in zip(reuse, shared)]
    p, q = max(own), max(new)
    keys, values = shape.buffers(b, p + q)
    input_ids = torch.zeros(b, q, dtype=torch.long)
    positions = torch.zeros(b, q, dtype=torch.long)
    allowed = torch.zeros(b, 1, q, p + q, dtype=torch.bool)
    diag = torch.arange(q)
    allowed[:, 0, diag, p + diag] = True  # every query sees itself (padding queries only that)
    for i, (it, r, s, o, n) in enumerate(zip(items, reuse, shared, own, new)):
        if o:
            it.entry.write(keys, values, i, p - o, s, r)
        input_ids[i, q - n:] = torch.tensor(it.tokens[r:])
        positions[i, q - n:] = torch.arange(r, r + n)
        allowed[i, 0, q - n:, p - o:p] = True
        allowed[i, 0, q - n:, p + q - n:] = torch.ones(n, n, dtype=torch.bool).tril()
    cache = Cache(layers=[BufferLayer(k, v, p) for k, v in zip(keys, values)])
    extra = {PREFIX_KWARG: groups} if groups else {}
    # One row needs no padding: a 2-D mask lets the model use causal attention (which skips the
    # masked half; on a 4k-token prompt that halves the attention work).
    mask = torch.ones(1, p + q, dtype=torch.long) if b == 1 else allowed
    dev = shape.device
    out = model(input_ids=input_ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
    logits = out.logits[:, -1].float()
    results = []
    for i, (it, r, n) in enumerate(zip(items, reuse, new)):
        entry = Entry(torch.tensor(it.tokens, dtype=torch.long), [k[i, :, p + q - n:].clone() for k in keys],
                      [v[i, :, p + q - n:].clone() for v in values], parent=it.entry if r else None, start=r)
        results.append((entry, logits[i]))
    return results


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # per row, up to and including its stop id
    logprobs: list[list[float]]
    stopped: list[bool]  # True = a stop id ended the row, False = its max_tokens did
    entries: list[Entry]  # per row: context + generated tokens whose key/values were computed
    steps: int = 0  # decode steps the batch ran
    row_steps: int = 0  # rows computed, summed over the steps (finished rows until they are dropped)
    drafted: int = 0  # speculative decoding (seal.engine.speculative): draft tokens verified
    accepted: int = 0  # of which the target accepted


# A decode batch drops its finished rows once they are at least this share of it: a row costs
# every step about as much as reading its key/values, and dropping rows copies the others' once.
DROP_FINISHED_SHARE = 0.25


def decode(model: Model, shape: KVShape, rows: list[Entry], first_logits: torch.Tensor, max_tokens: list[int],
           choose: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           logprob_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           stop_ids: set[int], pad_id: int, min_shared: int = DEFAULT_MIN_SHARED, hint_ngram: int = 0
           ) -> DecodeResult:
    """Decode all ``rows`` together over one left-padded cache.

    ``first_logits`` (B, V) are the rows' next-token logits from :func:`prefill`; ``choose`` maps
    (logits (B', V), index (B',)) to tokens (B',), ``index`` holding each batch row's position in
    ``rows`` (finished rows leave the batch, so a sampler keeping per-row state, such as a row's
    own generator, must look it up by these); ``logprob_of`` maps (logits, tokens) to log-probs. Rows
    sharing at least ``min_shared`` leading tokens read that prefix once per step as a
    :class:`~seal.engine.attention.PrefixGroup`; the buffers hold only the rest of each row.
    Finished rows leave the batch (:data:`DROP_FINISHED_SHARE`), so that the longest row does not
    make every other row decode as long. ``hint_ngram > 0`` calls ``choose(logits, index, hints)``
    with each row's prompt-lookup prediction of that order (:mod:`seal.engine.sampling` orders a
    sampled draw by it, so that plain and speculative decoding draw the same tokens).
    """
    groups, shared = prefix_groups(model, [r.tokens for r in rows], list(rows), [len(r) for r in rows], min_shared)
    b, steps = len(rows), max(max_tokens)
    width = max(len(r) - s for r, s in zip(rows, shared))
    keys, values = shape.buffers(b, width + steps)
    dev = shape.device
    mask = torch.zeros(b, width + steps, dtype=torch.long, device=dev)
    for i, (row, s) in enumerate(zip(rows, shared)):
        row.write(keys, values, i, width - (len(row) - s), s, len(row))
        mask[i, width - (len(row) - s):width] = 1
    positions = torch.tensor([[len(r)] for r in rows], device=dev)
    stop = torch.tensor(sorted(stop_ids), device=dev)
    limits = torch.tensor(max_tokens, device=dev)
    active = torch.arange(b, device=dev)  # each batch row's index in ``rows``
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    tokens = torch.full((b, steps), pad_id, dtype=torch.long, device=dev)
    logprobs = torch.zeros(b, steps, device=dev)
    finished: list[tuple[list[int], list[float], bool, Entry] | None] = [None] * b
    result = DecodeResult([], [], [], [])
    logits = first_logits
    cache = Cache(layers=[BufferLayer(k, v, width) for k, v in zip(keys, values)])
    indices = [NgramIndex(r.tokens.tolist(), hint_ngram) for r in rows] if hint_ngram > 0 else None
    for t in range(steps):
        if indices is None:
            chosen = choose(logits, active)
        else:
            chosen = choose(logits, active, torch.tensor([indices[i].hint() for i in active.tolist()], device=dev))
        tok = torch.where(done, torch.full_like(limits, pad_id), chosen)
        if indices is not None:
            for i, token in zip(active.tolist(), tok.tolist()):
                indices[i].push(token)
        tokens[active, t], logprobs[active, t] = tok, logprob_of(logits, tok)
        result.steps, result.row_steps = t + 1, result.row_steps + len(active)
        done = done | torch.isin(tok, stop) | (limits <= t + 1)
        if bool(done.all()):
            break
        if int(done.sum()) >= DROP_FINISHED_SHARE * len(active):
            for j in done.nonzero().flatten().tolist():
                i = int(active[j])
                finished[i] = _finish_row(rows[i], tokens[i], logprobs[i], max_tokens[i], stop_ids, keys, values, j,
                                          width)
            keep = (~done).nonzero().flatten()
            keys, values = _keep_rows(keys, keep, width + t), _keep_rows(values, keep, width + t)
            mask, positions, limits, tok = mask[keep], positions[keep], limits[keep], tok[keep]
            groups, active, done = _keep_group_rows(groups, keep, len(done)), active[keep], done[keep]
            cache = Cache(layers=[BufferLayer(k, v, width + t) for k, v in zip(keys, values)])
        mask[:, width + t] = 1
        extra = {PREFIX_KWARG: groups} if groups else {}
        out = model(input_ids=tok[:, None], attention_mask=mask[:, : width + t + 1], position_ids=positions,
                    past_key_values=cache, use_cache=True, **extra)
        logits = out.logits[:, -1].float()
        positions = positions + 1
    for j, i in enumerate(active.tolist()):
        finished[i] = _finish_row(rows[i], tokens[i], logprobs[i], max_tokens[i], stop_ids, keys, values, j, width)
    result.tokens, result.logprobs, result.stopped, result.entries = map(list, zip(*finished))
    return result


def _finish_row(row: Entry, tokens: torch.Tensor, logprobs: torch.Tensor, max_tokens: int, stop_ids: set[int],
                keys: list[torch.Tensor], values: list[torch.Tensor], j: int, width: int
                ) -> tuple[list[int], list[float], bool, Entry]:
    """A row's tokens cut at its stop id or limit, their log-probs, whether a stop id ended it, and
    the entry extending ``row`` with the key/values of batch row ``j``'s generated positions: all
    its tokens but the last, which was sampled and never fed back."""
    seq = tokens.tolist()[:max_tokens]
    end = next((n + 1 for n, t in enumerate(seq) if t in stop_ids), None)
    seq = seq[:end] if end is not None else seq
    kept = len(seq) - 1
    ids = torch.cat([row.tokens, torch.tensor(seq[:kept], dtype=torch.long)])
    entry = Entry(ids, [k[j, :, width:width + kept].clone() for k in keys],
                  [v[j, :, width:width + kept].clone() for v in values], parent=row, start=len(row))
    return seq, logprobs[: len(seq)].tolist(), end is not None, entry


def _keep_rows(buffers: list[torch.Tensor], keep: torch.Tensor, used: int) -> list[torch.Tensor]:
    """Buffers (B, H, capacity, D) cut to the batch rows ``keep``; only the ``used`` positions are
    copied (the rest is written by the steps to come before any mask lets it be read)."""
    kept = []
    for buf in buffers:
        out = torch.empty((len(keep), *buf.shape[1:]), dtype=buf.dtype, device=buf.device)
        out[:, :, :used] = buf[keep, :, :used]
        kept.append(out)
    return kept


def _keep_group_rows(groups: list[PrefixGroup], keep: torch.Tensor, batch: int) -> list[PrefixGroup]:
    """The prefix groups over the batch rows ``keep`` (ascending), renumbered; empty ones dropped."""
    new_index = torch.full((batch,), -1, dtype=torch.long, device=keep.device)
    new_index[keep] = torch.arange(len(keep), device=keep.device)
    kept = []
    for group in groups:
        rows = new_index[group.rows]
        rows = rows[rows >= 0]
        if len(rows):
            kept.append(PrefixGroup(rows, group.keys, group.values))
    return kept
