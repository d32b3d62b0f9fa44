"""Adapters between verl's ``DataProto`` training batch and the SEAL hooks' plain data.

The episode runner returns each episode's diagnosis in ``AgentLoopOutput.extra_fields``; verl's
agent-loop worker turns every extra field into a ``non_tensor_batch`` column (one object per row),
so after rollout the training batch carries, per row: ``task_id``, ``category``, ``tags`` (one
failure tag per ground-truth turn), ``check``, ``env_fault``, ``llm_fault``, ... These functions
read those columns; they never touch verl's tensors except the ones named in their docstrings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seal.diagnosis.stats import extract_error_messages
from seal.trainer.step_rules import EXCLUSION_FIELDS, StepSelection, select_trainable
from seal.types import category_of


def _column(batch: Any, name: str) -> Sequence[Any] | None:
    col = batch.non_tensor_batch.get(name)
    return None if col is None else list(col)


def _row_value(col: Sequence[Any] | None, i: int) -> Any:
    return None if col is None else col[i]


def _tags(value: Any) -> list[str] | None:
    if value is None:
        return None
    tags = [str(t) for t in (value.tolist() if isinstance(value, np.ndarray) else value)]
    return tags or None


def episode_rows(batch: Any) -> list[dict[str, Any]]:
    """One plain dict per batch row, in the form :meth:`seal.trainer.hooks.SealHooks.observe` reads.

    ``reward`` is the row's outcome reward (``token_level_scores`` summed over the response, i.e.
    the episode runner's ``reward_score``); ``success`` is the verifier's verdict
    (``check["valid"]``) when the row has one, else ``reward >= 1``.

    Raises:
        KeyError: the batch has no ``task_id`` column (the rollout did not use the SEAL loop).
    """
    n = len(batch)
    if "task_id" not in batch.non_tensor_batch:
        raise KeyError("the training batch has no 'task_id' column: set "
                       "actor_rollout_ref.rollout.agent.default_agent_loop=seal_bfcl and use BfclTaskDataset")
    scores = batch.batch["token_level_scores"].sum(dim=-1).tolist()
    cols = {k: _column(batch, k) for k in
            ("task_id", "category", "data_source", "tags", "check", "env_fault", "llm_fault",
             "excluded", "error_messages", "messages", "uid", "truncated_response_tokens")}
    rows = []
    for i in range(n):
        task_id = str(cols["task_id"][i])
        check = _row_value(cols["check"], i)
        check = dict(check) if isinstance(check, Mapping) else None
        reward = float(scores[i])
        errors = _row_value(cols["error_messages"], i)
        if errors is None and _row_value(cols["messages"], i) is not None:
            errors = extract_error_messages(list(cols["messages"][i]))
        rows.append({
            "task_id": task_id,
            "category": str(_row_value(cols["category"], i) or _row_value(cols["data_source"], i)
                            or category_of(task_id)),
            "uid": _row_value(cols["uid"], i),
            "reward": reward,
            "success": bool(check["valid"]) if check is not None and "valid" in check else reward >= 1.0,
            "tags": _tags(_row_value(cols["tags"], i)),
            "env_fault": bool(_row_value(cols["env_fault"], i)),
            "llm_fault": bool(_row_value(cols["llm_fault"], i)),
            "excluded": bool(_row_value(cols["excluded"], i)),
            "truncated_tokens": int(_row_value(cols["truncated_response_tokens"], i) or 0),
            "error_messages": [str(e) for e in (errors or [])],
        })
    return rows


def step_selection(batch: Any, *, n: int) -> StepSelection:
    """The shared step rules (:mod:`seal.trainer.step_rules`) on a batch's rows: episodes that
    faulted or were excluded (the runner's ``env_fault`` / ``llm_fault`` / ``excluded`` columns),
    and lone survivors of their GRPO group (``uid``). Reads no reward, so it works right after
    rollout as well as after ``compute_advantage``."""
    size = len(batch)
    flags = [_column(batch, f) or [False] * size for f in EXCLUSION_FIELDS]
    excluded = [any(bool(col[i]) for col in flags) for i in range(size)]
    groups = _column(batch, "uid") or _column(batch, "task_id") or list(range(size))
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
