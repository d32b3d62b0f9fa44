"""Log-probs of a GRPO group's episodes with their shared prompt computed once.

The n episodes of a task start with the same prompt (system turn, tool schemas, first user turn),
most of each episode's tokens. Computing it once per group and attending every row's continuation
to its key/values gives the same log-probs and the same gradients as one sequence per row, for
``P + n R`` tokens of work instead of ``n (P + R)``.

How the gradient stays exact: the prefix runs once with the cache on; its per-layer key/values are
handed to each row's continuation as detached leaves. Each row's backward stops at those leaves,
where the key/value gradients of all rows add up; one backward through the prefix with that sum
then gives the prefix's weights exactly the gradient the n separate sequences would have (the
chain rule is linear in the upstream gradient). Only one row's activations are alive at a time.

The LM head runs only where a log-prob is read: response positions with mask 1 (the model's own
tokens); tool observations inside the response, which the loss mask drops, get no logits. Their
log-prob entries are 0, and every use of them is multiplied by the mask.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

logger = logging.getLogger(__name__)

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
    """The longest common prefix of the rows, cut so that every row keeps at least its last prompt
    token out of it (that position's logits give the first response token's log-prob)."""
    limit = min(r.prompt_len for r in rows) - 1
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


def supports_prefix(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` keeps its cache: gradient checkpointing in training mode
    silently drops it (transformers' checkpointed layers set ``past_key_values=None``)."""
    return not (model.training and getattr(model, "is_gradient_checkpointing", False))


def prefix_key_values(model: torch.nn.Module, ids: Sequence[int], device: torch.device) -> KeyValues:
    """Per-layer ``(keys, values)`` (1, Hkv, S, D) of ``ids``; part of the graph when grad is on."""
    inputs = torch.tensor([list(ids)], dtype=torch.long, device=device)
    cache = model(input_ids=inputs, use_cache=True, logits_to_keep=1).past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def continuation_logprobs(model: torch.nn.Module, row: Row, shared: int, prefix: KeyValues | None,
                          device: torch.device) -> torch.Tensor:
    """``(R,)`` float32 log-probs of ``row``'s response, 0 where not read, given the key/values of
    its first ``shared`` tokens (``prefix``; ``None`` with ``shared == 0``)."""
    out = torch.zeros(row.response_len, dtype=torch.float32, device=device)
    if row.read.numel() == 0:
        return out
    ids = torch.tensor(row.ids, dtype=torch.long, device=device)
    read = row.read.to(device)
    # The logits at position p predict token p + 1: response token j (at prompt_len + j) is read
    # from position prompt_len + j - 1, i.e. that minus ``shared`` in the continuation.
    keep = read + (row.prompt_len - 1 - shared)
    cache = DynamicCache(ddp_cache_data=prefix) if prefix is not None else None
    logits = model(input_ids=ids[None, shared:], past_key_values=cache, use_cache=cache is not None,
                   logits_to_keep=keep).logits[0].float()
    targets = ids[row.prompt_len + read]
    picked = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return out.index_copy(0, read, picked)


@torch.no_grad()
def group_logprobs(model: torch.nn.Module, rows: Sequence[Row], group: Group, device: torch.device
                   ) -> dict[int, torch.Tensor]:
    """``row index -> (R,)`` log-probs (on the CPU) of the group's rows, no graph."""
    first = rows[group.rows[0]]
    prefix = prefix_key_values(model, first.ids[: group.shared], device) if group.shared else None
    return {i: continuation_logprobs(model, rows[i], group.shared, prefix, device).cpu() for i in group.rows}


def backward_group(model: torch.nn.Module, rows: Sequence[Row], group: Group, device: torch.device,
                   row_loss: Callable[[int, torch.Tensor], torch.Tensor],
                   forward_context: ForwardContext = contextlib.nullcontext) -> None:
    """Backward of ``sum(row_loss(i, logp_i))`` over the group's rows, the prefix computed once.

    ``row_loss(i, logp)`` gets row ``i``'s ``(R,)`` log-probs (with graph) and returns its scalar
    loss; parameter gradients accumulate as if each row were its own sequence."""
    if not group.shared:
        for i in group.rows:
            with forward_context():
                logp = continuation_logprobs(model, rows[i], 0, None, device)
            _backward_if_graph(row_loss(i, logp))
        return
    with forward_context():
        prefix = prefix_key_values(model, rows[group.rows[0]].ids[: group.shared], device)
    leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in prefix]
    for i in group.rows:
        with forward_context():
            logp = continuation_logprobs(model, rows[i], group.shared, leaves, device)
        _backward_if_graph(row_loss(i, logp))
    backward_through_prefix(prefix, leaves)


def backward_through_prefix(prefix: KeyValues, leaves: KeyValues) -> None:
    """One backward through the prefix's computation with the key/value gradients that the rows'
    backwards summed into ``leaves``."""
    outputs, grads = [], []
    for pair, leaf_pair in zip(prefix, leaves):
        for out, leaf in zip(pair, leaf_pair):
            if leaf.grad is not None:
                outputs.append(out)
                grads.append(leaf.grad)
    if outputs:
        torch.autograd.backward(outputs, grads)


def _backward_if_graph(loss: torch.Tensor) -> None:
    if loss.requires_grad:
        loss.backward()
