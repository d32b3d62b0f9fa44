"""SEAL's records of a V1 training step, read from verl's TransferQueue.

verl's V1 trainer holds a step's batch in TransferQueue: the trainer sees a ``KVBatchMeta`` (one
key per episode, ``{uid}_{session}_{index}``, and a small tag per key) and reads or writes fields
with ``tq.kv_batch_get`` / ``tq.kv_batch_put``. The episode runner's record of each episode
(:meth:`seal.episode.EpisodeResult.to_fields`) travels as the episode's ``extra_fields`` dict.

:func:`read_step` reads the records once per step, right after verl balanced (padded and
reordered) the batch. Padding rows that verl adds to fill a data-parallel multiple copy the first
episode's fields, so they are recognised by their ``is_padding`` tag and never counted: they are
neither observed, nor diagnosed, nor part of any GRPO group. :func:`zero_masks` zeroes the loss
masks of the rows the step rules leave out, so the actor's loss and token count never see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict

from seal.episode import EpisodeResult
from seal.trainer.step_rules import StepSelection, select_trainable, signal_metrics

# The masks verl's actor reads: the policy loss weighs tokens by ``response_mask``, the token
# count that normalises it reads ``loss_mask``.
MASK_FIELDS = ("response_mask", "loss_mask")


@dataclass(frozen=True)
class StepEpisodes:
    """One training step's episodes in the batch's key order.

    ``keys``: every row of the balanced batch; ``results[i]`` is row ``i``'s record, None on a
    padding row; ``selection`` is the step rules' outcome over the real rows (in key order).
    """

    keys: tuple[str, ...]
    results: tuple[EpisodeResult | None, ...]
    selection: StepSelection
    groups: tuple[str | None, ...] = ()

    @property
    def episodes(self) -> list[EpisodeResult]:
        """The real episodes (padding rows left out), in key order."""
        return [r for r in self.results if r is not None]

    def trainable_rows(self) -> list[bool]:
        """Per row of ``keys``: whether the update learns from it (padding rows: never)."""
        flags = iter(self.selection.trainable)
        return [False if r is None else next(flags) for r in self.results]

    def row_tags(self) -> list[list[str] | None]:
        """Per row: the episode's per-turn tags where it is trained on, else None (A-Patch's input)."""
        return [list(r.tags) if keep and r is not None else None
                for r, keep in zip(self.results, self.trainable_rows())]

    def signal_metrics(self) -> dict[str, float]:
        """:func:`seal.trainer.step_rules.signal_metrics` over the real rows."""
        real = [(r.reward, g) for r, g in zip(self.results, self.groups) if r is not None]
        return signal_metrics([x for x, _ in real], [g for _, g in real], self.selection.trainable)

    def row_call_turns(self) -> list[tuple[int, ...]]:
        return [tuple(r.call_turns) if r is not None else () for r in self.results]

    def aligned_to(self, keys: Sequence[str]) -> StepEpisodes:
        """The same episodes in another order of the same keys (verl may reorder between hooks)."""
        if tuple(keys) == self.keys:
            return self
        if sorted(keys) != sorted(self.keys):
            raise KeyError("the batch's keys changed since the step rules were applied")
        at = {k: i for i, k in enumerate(self.keys)}
        order = [at[k] for k in keys]
        trainable = self.trainable_rows()
        results = tuple(self.results[i] for i in order)
        real = [i for i in order if self.results[i] is not None]
        excluded = [self.results[i].excluded for i in real]
        return StepEpisodes(tuple(keys), results, StepSelection.from_flags([trainable[i] for i in real], excluded),
                            tuple(self.groups[i] for i in order))


def record_of(extra_fields: Any) -> EpisodeResult:
    """The episode runner's record from one episode's ``extra_fields``.

    Raises:
        KeyError: the fields are not a SEAL record (the rollout did not use the SEAL loop).
    """
    if not isinstance(extra_fields, dict) or any(name not in extra_fields for name in ("task_id", "check", "excluded")):
        raise KeyError("a training episode carries no SEAL record in extra_fields: the rollout did not use the "
                       "SEAL episode runner; set actor_rollout_ref.rollout.agent.default_agent_loop=seal")
    return EpisodeResult.from_fields(extra_fields)


def read_step(batch: Any, *, n: int) -> StepEpisodes:
    """The records of ``batch`` (a ``KVBatchMeta``) and the step rules' selection over its real rows
    (:func:`seal.trainer.step_rules.select_trainable`, grouped by GRPO ``uid``)."""
    keys = list(batch.keys)
    padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
    real_keys = [k for k, pad in zip(keys, padding) if not pad]
    data = tq.kv_batch_get(keys=real_keys, partition_id=batch.partition_id, select_fields=["uid", "extra_fields"])
    records = iter([record_of(fields) for fields in list(data["extra_fields"])])
    uids = [str(u) for u in list(data["uid"])]
    results = tuple(None if pad else next(records) for pad in padding)
    real = [r for r in results if r is not None]
    selection = select_trainable([r.excluded for r in real], uids, n=n)
    real_uids = iter(uids)
    groups = tuple(None if pad else next(real_uids) for pad in padding)
    return StepEpisodes(tuple(keys), results, selection, groups)


def zero_masks(batch: Any, step: StepEpisodes) -> int:
    """Zero both loss masks of the real rows the step rules leave out (in TransferQueue); returns
    how many rows were zeroed."""
    left_out = [k for k, r, keep in zip(step.keys, step.results, step.trainable_rows()) if r is not None and not keep]
    if not left_out:
        return 0
    data = tq.kv_batch_get(keys=left_out, partition_id=batch.partition_id, select_fields=list(MASK_FIELDS))
    zeros = {name: torch.nested.as_nested_tensor([torch.zeros_like(t) for t in data[name].unbind()],
                                                 layout=torch.jagged) for name in MASK_FIELDS}
    tq.kv_batch_put(keys=left_out, partition_id=batch.partition_id, fields=TensorDict(zeros, batch_size=len(left_out)))
    return len(left_out)


def nested_zeros_like(batch: Any, field: str = "response_mask") -> torch.Tensor:
    """Zeros shaped like each row's ``field`` (nested, float32), for log-prob fields that a
    skipped worker call would have written."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[field])
    return torch.nested.as_nested_tensor([torch.zeros(t.shape, dtype=torch.float32) for t in data[field].unbind()],
                                         layout=torch.jagged)
