"""Log-probs of a GRPO group's episodes with their shared beginning computed once.

The n episodes of a task start with the same prompt (system turn, tool schemas, first user turn),
most of each episode's tokens, and often with the same first model turn too. Computing that common
prefix once per group and attending every row's continuation to its key/values gives the same
log-probs and the same gradients as one sequence per row, for ``S + sum(L_i - S)`` tokens of work
instead of ``sum(L_i)``.

How the gradient stays exact: the prefix runs once with the cache on; its per-layer key/values
(and the log-softmax rows at the positions read inside it) are handed to each row's continuation
as detached leaves. Each row's backward stops at those leaves, where the gradients of all rows
add up; one backward through the prefix with that sum then gives the prefix's weights exactly the
gradient the n separate sequences would have (the chain rule is linear in the upstream gradient).
Only one row's activations are alive at a time.

The LM head runs only where a log-prob is read: response positions with mask 1 (the model's own
tokens); tool observations inside the response, which the loss mask drops, get no logits. Their
log-prob entries are 0, and every use of them is multiplied by the mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

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
class Group:
    """Rows (batch indices) that share their first ``shared`` tokens (0: each row on its own)."""

    rows: list[int]
    shared: int


def shared_length(rows: Sequence[Row]) -> int:
    """The longest common prefix of the rows' tokens, cut so that every row keeps at least one
    token of its own (its continuation is never empty)."""
    limit = min(len(r.ids) for r in rows) - 1
    first = rows[0].ids
    n = 0
    while n < limit and all(r.ids[n] == first[n] for r in rows[1:]):
        n += 1
    return n


def plan_groups(rows: Sequence[Row], keys: Sequence[str], indices: Sequence[int], min_tokens: int) -> list[Group]:
    """Group ``indices`` by ``keys`` (the GRPO uid), in first-seen order; a group shares its common
    prefix when that is at least ``min_tokens`` long and it has two rows or more, otherwise each of
    its rows is a group of its own with nothing shared."""
    by_key: dict[str, list[int]] = {}
    for i in indices:
        by_key.setdefault(keys[i], []).append(i)
    groups = []
    for members in by_key.values():
        shared = shared_length([rows[i] for i in members]) if len(members) > 1 else 0
        if shared >= min_tokens > 0:
            groups.append(Group(members, shared))
        else:
            groups.extend(Group([i], 0) for i in members)
    return groups


@dataclass(frozen=True)
class SharedPrefix:
    """A group's first ``length`` tokens computed once: per-layer ``(keys, values)``
    (1, Hkv, length, D), and the log-softmax rows ``log_probs`` (Q, V) float32 at the logit
    positions ``positions`` (Q,) inside the prefix that some row reads (sorted)."""

    length: int
    key_values: KeyValues
    positions: torch.Tensor
    log_probs: torch.Tensor

    def detached(self) -> SharedPrefix:
        """The same tensors as leaves that collect the rows' gradients."""
        kv = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in self.key_values]
        return SharedPrefix(self.length, kv, self.positions, self.log_probs.detach().requires_grad_())

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


def compute_prefix(model: torch.nn.Module, rows: Sequence[Row], group: Group, device: torch.device
                   ) -> SharedPrefix:
    """The group's shared prefix; part of the graph when grad is on."""
    length = group.shared
    read = torch.cat([logit_positions(rows[i]) for i in group.rows])
    positions = torch.unique(read[read < length])  # sorted
    ids = torch.tensor([rows[group.rows[0]].ids[:length]], dtype=torch.long, device=device)
    keep = positions.to(device) if positions.numel() else 1
    out = model(input_ids=ids, use_cache=True, logits_to_keep=keep)
    log_probs = torch.log_softmax(out.logits[0].float(), dim=-1)[: positions.numel()]
    key_values = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    return SharedPrefix(length, key_values, positions, log_probs)


def row_logprobs(model: torch.nn.Module, row: Row, prefix: SharedPrefix | None, device: torch.device
                 ) -> torch.Tensor:
    """``(R,)`` float32 log-probs of ``row``'s response, 0 where not read: those predicted inside
    ``prefix`` from its log-softmax rows, the others by running the row's continuation on its
    key/values (``prefix=None``: the whole row as one sequence)."""
    out = torch.zeros(row.response_len, dtype=torch.float32, device=device)
    ids = torch.tensor(row.ids, dtype=torch.long, device=device)
    at = logit_positions(row)
    length = prefix.length if prefix is not None else 0
    inside = at < length
    if inside.any():
        q = at[inside]
        lp = prefix.log_probs[torch.searchsorted(prefix.positions, q).to(device), ids[(q + 1).to(device)]]
        out = out.index_copy(0, row.read[inside].to(device), lp)
    if (~inside).any():
        q = at[~inside]
        cache = DynamicCache(ddp_cache_data=prefix.key_values) if prefix is not None else None
        logits = model(input_ids=ids[None, length:], past_key_values=cache, use_cache=cache is not None,
                       logits_to_keep=(q - length).to(device)).logits[0].float()
        targets = ids[(q + 1).to(device)]
        lp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        out = out.index_copy(0, row.read[~inside].to(device), lp)
    return out


@torch.no_grad()
def group_logprobs(model: torch.nn.Module, rows: Sequence[Row], group: Group, device: torch.device
                   ) -> dict[int, torch.Tensor]:
    """``row index -> (R,)`` log-probs (on the CPU) of the group's rows, no graph."""
    prefix = compute_prefix(model, rows, group, device) if group.shared else None
    return {i: row_logprobs(model, rows[i], prefix, device).cpu() for i in group.rows}


def backward_group(model: torch.nn.Module, rows: Sequence[Row], group: Group, device: torch.device,
                   row_loss: Callable[[int, torch.Tensor], torch.Tensor],
                   forward_context: ForwardContext = contextlib.nullcontext) -> None:
    """Backward of ``sum(row_loss(i, logp_i))`` over the group's rows, the prefix computed once.

    ``row_loss(i, logp)`` gets row ``i``'s ``(R,)`` log-probs (with graph) and returns its scalar
    loss; parameter gradients accumulate as if each row were its own sequence."""
    prefix = leaves = None
    if group.shared:
        with forward_context():
            prefix = compute_prefix(model, rows, group, device)
        leaves = prefix.detached()
    for i in group.rows:
        with forward_context():
            logp = row_logprobs(model, rows[i], leaves, device)
        _backward_if_graph(row_loss(i, logp))
    if prefix is not None:
        backward_through_prefix(prefix, leaves)


def backward_through_prefix(prefix: SharedPrefix, leaves: SharedPrefix) -> None:
    """One backward through the prefix's computation with the gradients that the rows' backwards
    summed into ``leaves``."""
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
