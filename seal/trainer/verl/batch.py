"""Adapters between verl's ``DataProto`` training batch and the SEAL hooks' typed records.

The episode runner returns each episode's record in its field form
(:meth:`seal.episode.EpisodeResult.to_fields`) as ``AgentLoopOutput.extra_fields``; verl's
agent-loop worker turns every extra field into a ``non_tensor_batch`` column (one object per
row). :func:`episode_results` reads the records back; the other functions never touch verl's
tensors except the ones named in their docstrings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seal.episode import FIELD_NAMES, EpisodeResult
from seal.trainer.step_rules import StepSelection, select_trainable


def _column(batch: Any, name: str) -> Sequence[Any] | None:
    col = batch.non_tensor_batch.get(name)
    return None if col is None else list(col)


def episode_results(batch: Any) -> list[EpisodeResult]:
    """The episode runner's record of every batch row (:meth:`EpisodeResult.from_fields` on the
    row's ``extra_fields`` columns), in row order.

    Raises:
        KeyError: the batch has no ``task_id`` column (the rollout did not use the SEAL loop).
    """
    ntb = batch.non_tensor_batch
    if "task_id" not in ntb:
        raise KeyError("the training batch has no 'task_id' column: set "
                       "actor_rollout_ref.rollout.agent.default_agent_loop=seal_bfcl and use BfclTaskDataset")
    missing = [name for name in FIELD_NAMES if name not in ntb]
    if missing:
        raise KeyError(f"the training batch lacks the episode columns {missing}: the rollout did not use "
                       "the SEAL episode runner (actor_rollout_ref.rollout.agent.default_agent_loop=seal_bfcl)")
    columns = {name: ntb[name] for name in FIELD_NAMES}
    return [EpisodeResult.from_fields({name: col[i] for name, col in columns.items()}) for i in range(len(batch))]


def step_selection(batch: Any, *, n: int, results: Sequence[EpisodeResult] | None = None) -> StepSelection:
    """The shared step rules (:mod:`seal.trainer.step_rules`) on a batch's rows: episodes the
    runner excluded (faults, prompts that did not fit), and lone survivors of their GRPO group
    (``uid``). Reads no reward, so it works right after rollout as well as after
    ``compute_advantage``. ``results``: the rows' records when the caller has already read them
    (:func:`episode_results`)."""
    excluded = [r.excluded for r in (episode_results(batch) if results is None else results)]
    groups = _column(batch, "uid") or _column(batch, "task_id")
    return select_trainable(excluded, groups, n=n)


def mask_untrainable(batch: Any, selection: StepSelection) -> None:
    """Zero the ``response_mask`` rows the step rules leave out, in place (idempotent)."""
    keep = torch.tensor(selection.trainable, dtype=torch.bool)
    mask = batch.batch["response_mask"]
    batch.batch["response_mask"] = mask * keep.to(mask.device).unsqueeze(-1).to(mask.dtype)


def exclude_rows(batch: Any, selection: StepSelection, *, adv_estimator: str, norm_adv_by_std_in_grpo: bool) -> None:
    """Keep the rows the step rules leave out of the update, in place: they are never trained on.

    Their ``response_mask`` and ``advantages`` rows become 0. With GRPO the advantages of the
    other rows are recomputed with verl's ``compute_grpo_outcome_advantage`` over the kept rows
    only, so a left-out episode's reward does not shift its group's baseline. Nothing happens
    when every row is kept.
    """
    if all(selection.trainable):
        return
    mask_untrainable(batch, selection)
    mask = batch.batch["response_mask"]
    adv = batch.batch["advantages"]
    keep = torch.tensor(selection.trainable, dtype=torch.bool, device=mask.device)
    if adv_estimator == "grpo" and bool(keep.any()):
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        idx = keep.nonzero(as_tuple=True)[0].cpu().numpy()
        uids = np.asarray(batch.non_tensor_batch["uid"], dtype=object)[idx]
        kept_adv, _ = compute_grpo_outcome_advantage(
            batch.batch["token_level_rewards"][keep], mask[keep], uids,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        adv = torch.zeros_like(adv)
        adv[keep] = kept_adv.to(adv.dtype)
    else:
        adv = adv * keep.unsqueeze(-1).to(adv.dtype)
    batch.batch["advantages"] = adv
    if adv_estimator == "grpo" and "returns" in batch.batch.keys():
        batch.batch["returns"] = adv.clone()  # verl's GRPO returns equal its advantages
