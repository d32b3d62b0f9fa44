"""Log-probs of a GRPO group's episodes with their shared beginnings computed once.

The n episodes of a task start with the same prompt (system turn, tool schemas, first user turn),
most of each episode's tokens, and often go on alike for a while: some of them write the same
first model turn and get the same tool observation back, and a confident policy writes some
episodes identically to the end. The rows of a group therefore form a prefix tree
(:func:`plan_groups`): every stretch of tokens that several rows share is one node, computed once
for all of them, and each row's own rest is a leaf that attends to the key/values of the nodes
above it. That gives the same log-probs and the same gradients as one sequence per row, for the
tree's tokens (each shared stretch once) instead of ``sum(L_i)``.

How the gradient stays exact: a node runs once with the cache on, on top of its parent's
key/values; its per-layer key/values (and the log-softmax rows at the positions read inside it)
are handed to its children as detached leaves. The children's backwards stop at those leaves,
where their gradients add up; one backward through the node with that sum then gives the weights
(and, through the cache it extended, the parent's leaves) exactly the gradient the separate
sequences would have (the chain rule is linear in the upstream gradient). Only one path of the
tree holds activations at a time.

The LM head runs only where a log-prob is read: response positions with mask 1 (the model's own
tokens); tool observations inside the response, which the loss mask drops, get no logits. Their
log-prob entries are 0, and every use of them is multiplied by the mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]
# The context of each model forward (autocast); losses and backward run outside it.
ForwardContext = Callable[[], AbstractContextManager]


@dataclass(frozen=True)
class Row:
    """One episode as the passes read it: ``ids`` = prompt + response, the prompt's length, and
    ``read`` (K,) long: the response positions whose log-prob is read (mask 1)."""

    ids: list[int]
    prompt_len: int
    read: torch.Tensor

    @property
    def response_len(self) -> int:
        return len(self.ids) - self.prompt_len

    @classmethod
    def of(cls, prompt_ids: Sequence[int], response_ids: Sequence[int], mask: Sequence[float]) -> Row:
        read = torch.tensor([j for j, m in enumerate(mask[: len(response_ids)]) if m > 0], dtype=torch.long)
        return cls(list(prompt_ids) + list(response_ids), len(prompt_ids), read)


@dataclass(frozen=True)
class Node:
    """Positions ``[start, end)`` whose tokens the batch rows ``rows`` share, computed once for all
    of them; ``children`` go on from ``end``. A leaf (no children) is one row's own rest, from
    ``start`` to the row's last token; a row in no shared node is a leaf from 0."""

    start: int
    end: int
    rows: list[int]
    children: list[Node] = field(default_factory=list)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def tokens_computed(self) -> int:
        """Tokens the tree under this node runs through the model (each shared stretch once)."""
        return self.end - self.start + sum(child.tokens_computed() for child in self.children)


def shared_end(rows: Sequence[Row], members: Sequence[int], start: int = 0) -> int:
    """Where the common prefix of ``members``' tokens ends, from ``start`` on (they agree before it),
    cut so that every row keeps at least one token of its own (its continuation is never empty)."""
    limit = min(len(rows[i].ids) for i in members) - 1
    first = rows[members[0]].ids
    n = start
    while n < limit and all(rows[i].ids[n] == first[n] for i in members[1:]):
        n += 1
    return n


def split_rows(rows: Sequence[Row], members: Sequence[int], start: int, min_tokens: int,
               agree: int | None = None) -> list[Node]:
    """The prefix tree of ``members`` from position ``start`` on (they agree on every token before
    it, and up to ``agree`` if given): a node for each set of two or more rows that share at least
    ``min_tokens`` tokens from ``start`` (a shorter stretch is not worth a forward of its own), a
    leaf for every other row."""
    at = start if agree is None else agree
    parts: dict[int, list[int]] = {}
    for i in members:
        parts.setdefault(rows[i].ids[at], []).append(i)
    nodes = []
    for part in parts.values():
        end = shared_end(rows, part, at) if len(part) > 1 else at
        if end - start >= min_tokens:
            nodes.append(Node(start, end, part, split_rows(rows, part, end, min_tokens)))
        elif end > at:  # they agree a little further, too little to share: look where they part
            nodes.extend(split_rows(rows, part, start, min_tokens, end))
        else:
            nodes.extend(Node(start, len(rows[i].ids), [i]) for i in part)
    return nodes


def plan_groups(rows: Sequence[Row], keys: Sequence[str], indices: Sequence[int], min_tokens: int) -> list[Node]:
    """The prefix trees of ``indices`` grouped by ``keys`` (the GRPO uid), in first-seen order: one
    tree per set of rows that share at least ``min_tokens`` first tokens, a leaf for every other row
    (``min_tokens <= 0``: every row a leaf, one sequence each)."""
    by_key: dict[str, list[int]] = {}
    for i in indices:
        by_key.setdefault(keys[i], []).append(i)
    if min_tokens <= 0:
        return [Node(0, len(rows[i].ids), [i]) for members in by_key.values() for i in members]
    return [node for members in by_key.values() for node in split_rows(rows, members, 0, min_tokens)]


@dataclass(frozen=True)
class SharedPrefix:
    """A node's tokens computed once: per-layer ``(keys, values)`` (1, Hkv, end, D) of positions
    ``[0, end)`` (its ancestors' and its own), and the log-softmax rows ``log_probs`` (Q, V) float32
    at the logit positions ``positions`` (Q,) in ``[start, end)`` that some row reads (sorted)."""

    start: int
    end: int
    key_values: KeyValues
    positions: torch.Tensor
    log_probs: torch.Tensor

    def detached(self) -> SharedPrefix:
        """The same tensors as leaves that collect the children's gradients."""
        kv = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in self.key_values]
        return SharedPrefix(self.start, self.end, kv, self.positions, self.log_probs.detach().requires_grad_())

    def tensors(self) -> list[torch.Tensor]:
        return [t for pair in self.key_values for t in pair] + [self.log_probs]


def logit_positions(row: Row) -> torch.Tensor:
    """(K,) the positions whose logits give ``row``'s read log-probs: response token ``j`` (at
    ``prompt_len + j``) is predicted at ``prompt_len + j - 1``."""
    return row.read + (row.prompt_len - 1)


def supports_prefix(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` keeps its cache: gradient checkpointing in training mode
    silently drops it (transformers' checkpointed layers set ``past_key_values=None``)."""
    return not (model.training and getattr(model, "is_gradient_checkpointing", False))


def compute_prefix(model: torch.nn.Module, rows: Sequence[Row], node: Node, device: torch.device,
                   parent: SharedPrefix | None = None) -> SharedPrefix:
    """The shared node ``node`` run on its parent's key/values; part of the graph when grad is on."""
    read = torch.cat([logit_positions(rows[i]) for i in node.rows])
    positions = torch.unique(read[(read >= node.start) & (read < node.end)])  # sorted
    ids = torch.tensor([rows[node.rows[0]].ids[node.start:node.end]], dtype=torch.long, device=device)
    keep = (positions - node.start).to(device) if positions.numel() else 1
    cache = DynamicCache(ddp_cache_data=parent.key_values) if parent is not None else None
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    log_probs = torch.log_softmax(out.logits[0].float(), dim=-1)[: positions.numel()]
    key_values = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    return SharedPrefix(node.start, node.end, key_values, positions, log_probs)


def row_logprobs(model: torch.nn.Module, row: Row, prefixes: Sequence[SharedPrefix], device: torch.device
                 ) -> torch.Tensor:
    """``(R,)`` float32 log-probs of ``row``'s response, 0 where not read: those predicted inside
    the shared nodes ``prefixes`` (the row's ancestors, root first) from their log-softmax rows, the
    others by running the row's rest on the last one's key/values (no ``prefixes``: the whole row
    as one sequence)."""
    out = torch.zeros(row.response_len, dtype=torch.float32, device=device)
    ids = torch.tensor(row.ids, dtype=torch.long, device=device)
    at = logit_positions(row)
    for node in prefixes:
        inside = (at >= node.start) & (at < node.end)
        if inside.any():
            q = at[inside]
            lp = node.log_probs[torch.searchsorted(node.positions, q).to(device), ids[(q + 1).to(device)]]
            out = out.index_copy(0, row.read[inside].to(device), lp)
    length = prefixes[-1].end if prefixes else 0
    own = at >= length
    if own.any():
        q = at[own]
        cache = DynamicCache(ddp_cache_data=prefixes[-1].key_values) if prefixes else None
        logits = model(input_ids=ids[None, length:], past_key_values=cache, use_cache=cache is not None,
                       logits_to_keep=(q - length).to(device)).logits[0].float()
        targets = ids[(q + 1).to(device)]
        lp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        out = out.index_copy(0, row.read[own].to(device), lp)
    return out


@torch.no_grad()
def group_logprobs(model: torch.nn.Module, rows: Sequence[Row], node: Node, device: torch.device,
                   ancestors: Sequence[SharedPrefix] = ()) -> dict[int, torch.Tensor]:
    """``row index -> (R,)`` log-probs (on the CPU) of the rows under ``node``, no graph."""
    if node.is_leaf:
        return {node.rows[0]: row_logprobs(model, rows[node.rows[0]], ancestors, device).cpu()}
    shared = compute_prefix(model, rows, node, device, ancestors[-1] if ancestors else None)
    out: dict[int, torch.Tensor] = {}
    for child in node.children:
        out.update(group_logprobs(model, rows, child, device, [*ancestors, shared]))
    return out


def backward_group(model: torch.nn.Module, rows: Sequence[Row], node: Node, device: torch.device,
                   row_loss: Callable[[int, torch.Tensor], torch.Tensor],
                   forward_context: ForwardContext = contextlib.nullcontext,
                   ancestors: Sequence[SharedPrefix] = ()) -> None:
    """Backward of ``sum(row_loss(i, logp_i))`` over the rows under ``node``, each shared node
    computed once (``ancestors``: the detached leaves of the nodes above, root first).

    ``row_loss(i, logp)`` gets row ``i``'s ``(R,)`` log-probs (with graph) and returns its scalar
    loss; parameter gradients accumulate as if each row were its own sequence."""
    if node.is_leaf:
        with forward_context():
            logp = row_logprobs(model, rows[node.rows[0]], ancestors, device)
        _backward_if_graph(row_loss(node.rows[0], logp))
        return
    with forward_context():
        shared = compute_prefix(model, rows, node, device, ancestors[-1] if ancestors else None)
    leaves = shared.detached()
    for child in node.children:
        backward_group(model, rows, child, device, row_loss, forward_context, [*ancestors, leaves])
    backward_through_prefix(shared, leaves)


def backward_through_prefix(prefix: SharedPrefix, leaves: SharedPrefix) -> None:
    """One backward through a shared node's computation with the gradients that its children's
    backwards summed into ``leaves`` (it reaches the weights and the parent's leaves)."""
    outputs, grads = [], []
    for out, leaf in zip(prefix.tensors(), leaves.tensors()):
        if leaf.grad is not None:
            outputs.append(out)
            grads.append(leaf.grad)
    if outputs:
        torch.autograd.backward(outputs, grads)


def _backward_if_graph(loss: torch.Tensor) -> None:
    if loss.requires_grad:
        loss.backward()
