"""Turning a step's episodes into GRPO advantages and one PPO policy update (verl's core_algos)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from seal.trainer.local import prefix
from seal.trainer.local.episodes import Episode
from seal.trainer.local.policy import (LossSettings, autocast_context, response_logprobs, same_weights,
                                      sequence_loss)

logger = logging.getLogger(__name__)


@dataclass
class Batch:
    """The trainable episodes of a step, response-aligned.

    ``mask``: ``(B, T)`` 1 on model-written response tokens (``T`` = longest response);
    ``rewards``: ``(B,)``; ``uids``: the GRPO group of each row.
    """

    episodes: list[Episode]
    mask: torch.Tensor
    rewards: torch.Tensor
    uids: list[str]


def build_batch(episodes: Sequence[Episode]) -> Batch:
    width = max(len(e.response_ids) for e in episodes)
    mask = torch.zeros(len(episodes), width, dtype=torch.float32)
    for i, e in enumerate(episodes):
        mask[i, : len(e.response_mask)] = torch.tensor(e.response_mask, dtype=torch.float32)
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
    return Batch(list(episodes), mask, rewards, [e.uid for e in episodes])


def grpo_advantages_verl(batch: Batch, *, norm_by_std: bool) -> torch.Tensor:
    """The GRPO advantages of the batch, ``(B, T)``, zero off the mask: the estimator the verl
    trainer runs (:func:`seal.advantage.grpo.grpo_advantages`, verl's GRPO underneath).

    The outcome reward sits on the first response token (verl sums the token rewards)."""
    from seal.advantage.grpo import grpo_advantages

    token_rewards = torch.zeros_like(batch.mask)
    token_rewards[:, 0] = batch.rewards
    return grpo_advantages(token_rewards, batch.mask, batch.uids, norm_by_std=norm_by_std)


def _minibatches(n_rows: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n_rows))) for i in range(0, n_rows, size)]


# A stretch of tokens that rows share, shorter than this, is not worth a forward of its own.
MIN_SHARED_PREFIX_TOKENS = 16


class RowForwards:
    """The update's forward passes over a batch's rows.

    ``shared_prefix``: the rows of a GRPO group run as a prefix tree, every stretch of tokens that
    several rows share (their prompt, and often more) computed once, logits only where a log-prob
    is read (:mod:`seal.trainer.local.prefix`; exact up to fp32 rounding).
    Otherwise, and while gradient checkpointing (which drops the cache) is on, each row is one
    full sequence (:func:`~seal.trainer.local.policy.response_logprobs`)."""

    def __init__(self, batch: Batch, *, shared_prefix: bool, device: torch.device, autocast: str) -> None:
        self.batch, self.shared_prefix, self.device, self.autocast = batch, shared_prefix, device, autocast
        self.rows = [prefix.Row.of(e.prompt_ids, e.response_ids, batch.mask[i].tolist())
                     for i, e in enumerate(batch.episodes)]
        self._warned = False

    def groups(self, model: torch.nn.Module, indices: Sequence[int]) -> list[prefix.Node] | None:
        """The prefix trees of ``indices``; ``None``: one full sequence per row."""
        if not self.shared_prefix:
            return None
        if not prefix.supports_prefix(model):
            if not self._warned:
                logger.warning("seal.local.shared_prefix_training: gradient checkpointing drops the cache the "
                               "shared prefix needs; each row runs as its own sequence")
                self._warned = True
            return None
        return prefix.plan_groups(self.rows, self.batch.uids, indices, MIN_SHARED_PREFIX_TOKENS)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, indices: Sequence[int]) -> dict[int, torch.Tensor]:
        """``row -> (R,)`` response log-probs of ``indices`` under ``model``, no graph."""
        groups = self.groups(model, indices)
        out: dict[int, torch.Tensor] = {}
        with self._autocast():
            if groups is None:
                for i in indices:
                    e = self.batch.episodes[i]
                    out[i] = response_logprobs(model, e.prompt_ids, e.response_ids, self.device).float().cpu()
                return out
            for group in groups:
                out.update(prefix.group_logprobs(model, self.rows, group, self.device))
        return out

    def backward(self, model: torch.nn.Module, indices: Sequence[int],
                 row_loss: Callable[[int, torch.Tensor], torch.Tensor]) -> None:
        """Accumulate the gradient of ``sum(row_loss(i, logp_i))`` over ``indices``."""
        groups = self.groups(model, indices)
        if groups is not None:
            for group in groups:
                prefix.backward_group(model, self.rows, group, self.device, row_loss, self._autocast)
            return
        for i in indices:
            e = self.batch.episodes[i]
            with self._autocast():
                logp = response_logprobs(model, e.prompt_ids, e.response_ids, self.device).float()
            row_loss(i, logp).backward()

    def _autocast(self) -> contextlib.AbstractContextManager:
        return autocast_context(self.device, self.autocast)


def rows_with_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` bool: the rows of ``advantages`` ``(B, T)`` with a non-zero advantage on a response
    token (a GRPO group whose episodes all scored the same has none)."""
    return ((advantages != 0) & (mask[:, : advantages.shape[1]] > 0)).any(dim=1)


def rows_with_signal(advantages: torch.Tensor, mask: torch.Tensor, settings: LossSettings) -> list[bool]:
    """Per row of ``advantages`` ``(B, T)``: whether its loss has a term besides the KL one.

    A row whose advantage is exactly 0 on every response token has a PPO-clip term of exactly 0
    with gradient 0 (every branch of the clip multiplies the advantage). An entropy term would
    still train such a row, so with one every row counts."""
    if settings.entropy_coeff != 0:
        return [True] * advantages.shape[0]
    return rows_with_advantage(advantages, mask).tolist()


def kl_gradient_is_zero(model: torch.nn.Module, ref_model: torch.nn.Module | None, settings: LossSettings,
                        *, at_reference: bool | None = None) -> tuple[bool, str]:
    """Whether the KL term gives no gradient now, and why: there is none, or the policy still
    equals the reference (bit-identical weights) and the estimator's gradient vanishes there.
    ``at_reference``: that equality when the caller already compared the weights."""
    if not settings.use_kl_loss or ref_model is None:
        return True, "no KL loss"
    if not settings.kl_grad_vanishes_at_reference:
        return False, f"kl_loss_type={settings.kl_loss_type} has a gradient at the reference"
    if same_weights(model, ref_model) if at_reference is None else at_reference:
        return True, f"the policy equals the reference, {settings.kl_loss_type} gradient 0"
    return False, "the policy differs from the reference"


# Loss metrics that are each sequence's share of its mini-batch's loss (the aggregation divides by
# the whole mini-batch's tokens or sequences): a mini-batch reports their sum, as verl's worker sums
# them over its micro-batches. The other loss metrics are means over the mini-batch's sequences.
_SHARES = ("actor/pg_loss", "actor/kl_loss")


def policy_update(model: torch.nn.Module, ref_model: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
                  batch: Batch, advantages: torch.Tensor, settings: LossSettings, *, device: torch.device,
                  autocast: str, mini_batch_rows: int, ppo_epochs: int, grad_clip: float,
                  shared_prefix: bool = True) -> dict[str, float]:
    """PPO-clip updates on ``batch`` with ``advantages`` ``(B, T)``; returns ``actor/...`` metrics
    and ``timing/ref_s`` (the reference and old-policy log-prob passes).

    No padding: each GRPO group's rows run on their shared prompt computed once
    (``shared_prefix``, :class:`RowForwards`), or each row is its own sequence; gradients
    accumulate. With a single update per step the old policy *is* the current one, so its
    log-probs are the detached current ones; otherwise they are computed once, before the first
    update. While the policy's weights are still the reference's (a run's first update), the
    reference log-probs are the detached current ones too: the reference pass starts after the
    first optimizer step. An update whose gradient norm is not finite is skipped, as verl does.

    Rows that cannot change the weights are left out of forward and backward: a zero advantage
    everywhere (:func:`rows_with_signal`) while the KL term has no gradient
    (:func:`kl_gradient_is_zero`; once an optimizer step moves the policy off the reference, rows
    with a KL term train again). The token-mean still divides by the whole mini-batch's tokens,
    so the gradient is exactly the full batch's. A mini-batch with no row left does no optimizer
    step (``actor/skipped_updates``): weights and AdamW state (moments, step count) stay as they
    are; the local trainer has no LR scheduler (constant LR, the paper's recipe).

    The loss metrics are verl's: each mini-batch's (:func:`_train_minibatch`), averaged over the
    mini-batches that trained, so ``actor/pg_loss`` is the loss the optimizer stepped on.
    """
    n_rows = len(batch.episodes)
    mini_batch_rows = max(1, mini_batch_rows)
    minibatches = _minibatches(n_rows, mini_batch_rows)
    single = ppo_epochs * len(minibatches) == 1
    signal = rows_with_signal(advantages, batch.mask, settings)
    use_ref = settings.use_kl_loss and ref_model is not None
    # While the policy still equals the reference (a run's first update), the reference's
    # log-probs are the policy's own: no reference pass until the first optimizer step.
    at_reference = use_ref and same_weights(model, ref_model)
    droppable, why = (kl_gradient_is_zero(model, ref_model, settings, at_reference=at_reference)
                      if not all(signal) else (False, ""))
    forwards = RowForwards(batch, shared_prefix=shared_prefix, device=device, autocast=autocast)
    t_ref = time.perf_counter()
    # Old log-probs only enter through the ratio, which multiplies the advantage.
    old = {} if single else forwards.logprobs(model, [i for i in range(n_rows) if signal[i]])
    ref_seconds = time.perf_counter() - t_ref
    ref: dict[int, torch.Tensor] = {}
    model.train()
    counts: Counter[str] = Counter()
    trained: list[dict[str, float]] = []  # one entry per mini-batch that ran forward/backward
    for _ in range(ppo_epochs):
        for rows in minibatches:
            train_rows = [i for i in rows if signal[i] or not droppable]
            counts["actor/skipped_rows"] += len(rows) - len(train_rows)
            if not train_rows:
                counts["actor/skipped_updates"] += 1
                continue
            if use_ref and not at_reference:  # the reference is frozen: its log-probs are taken when first needed
                t_ref = time.perf_counter()
                ref.update(forwards.logprobs(ref_model, [i for i in train_rows if i not in ref]))
                ref_seconds += time.perf_counter() - t_ref
            stepped, metrics = _train_minibatch(model, optimizer, forwards, advantages, settings, rows, train_rows,
                                                old, ref, at_reference=at_reference, mini_batch_rows=mini_batch_rows,
                                                grad_clip=grad_clip)
            trained.append(metrics)
            if stepped and use_ref:
                droppable = at_reference = False  # the policy has left the reference: the KL term has a gradient now
    if counts["actor/skipped_updates"] == ppo_epochs * len(minibatches):
        logger.warning("update skipped: all %d episodes have advantage 0 and no other loss term (%s); no "
                       "forward/backward, no optimizer step", n_rows, why)
    # The mean over mini-batches, as verl's fit() reduces its worker's per-mini-batch metrics.
    out = {k: sum(m[k] for m in trained) / len(trained) for k in (trained[0] if trained else {})}
    out.update({k: float(counts[k]) for k in ("actor/skipped_updates", "actor/skipped_rows")})
    out["actor/num_updates"] = float(ppo_epochs * len(minibatches))
    out["actor/response_tokens"] = float(batch.mask.sum().item())
    out["actor/advantage_rows"] = float(rows_with_advantage(advantages, batch.mask).sum().item())
    out["timing/ref_s"] = ref_seconds
    return out


def _train_minibatch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, forwards: RowForwards,
                     advantages: torch.Tensor, settings: LossSettings, rows: list[int], train_rows: list[int],
                     old: dict[int, torch.Tensor], ref: dict[int, torch.Tensor], *, at_reference: bool,
                     mini_batch_rows: int, grad_clip: float) -> tuple[bool, dict[str, float]]:
    """Forward/backward over ``train_rows`` of the mini-batch ``rows``, then one optimizer step.

    The aggregation's token count is the whole mini-batch's (the rows left out contribute
    exactly 0). Its sequence count (the seq-mean modes' denominator) is the configured
    ``mini_batch_rows``, verl's ``ppo_mini_batch_size x n``: verl divides by it with the episodes
    the step rules left out still in the mini-batch as zero-mask rows. ``at_reference``: the
    policy's weights are the reference's, whose log-probs are then the detached current ones
    (``ref`` is not read). Returns whether the
    optimizer stepped, and the mini-batch's metrics as verl's worker reports one: its loss, KL
    loss and total loss (sums of the sequences' shares), its gradient norm before clipping, the
    other loss metrics' means over sequences."""
    batch, device = forwards.batch, forwards.device
    ntok = int(batch.mask[rows].sum().item())
    optimizer.zero_grad(set_to_none=True)
    loss_total = 0.0
    per_sequence: list[dict[str, float]] = []

    def row_loss(i: int, logp: torch.Tensor) -> torch.Tensor:
        nonlocal loss_total
        r = logp.shape[0]
        old_i = old[i].to(device) if i in old else logp.detach()
        if at_reference:
            ref_i = logp.detach().unsqueeze(0)
        else:
            ref_i = ref[i].to(device).unsqueeze(0) if i in ref else None
        loss, m = sequence_loss(
            logp.unsqueeze(0), old_i.unsqueeze(0), ref_i, advantages[i : i + 1, :r].to(device),
            batch.mask[i : i + 1, :r].to(device), settings, batch_num_tokens=max(ntok, 1),
            global_batch_size=mini_batch_rows,
        )
        loss_total += float(loss.detach())
        per_sequence.append(m)
        return loss

    forwards.backward(model, train_rows, row_loss)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
    stepped = math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    else:
        logger.warning("non-finite gradient norm; update skipped")
    optimizer.zero_grad(set_to_none=True)
    metrics = {k: sum(m[k] for m in per_sequence) / (1 if k in _SHARES else len(per_sequence))
               for k in per_sequence[0]}
    metrics.update({"actor/loss": loss_total, "actor/grad_norm": grad_norm})
    return stepped, metrics
