"""Adapters between verl's ``DataProto`` training batch and SEAL's typed records.

The episode runner returns each episode's record in its field form
(:meth:`seal.episode.EpisodeResult.to_fields`) as ``AgentLoopOutput.extra_fields``; verl's
agent-loop worker turns every extra field into a ``non_tensor_batch`` column (one object per
row). :func:`episode_results` reads the records back; :func:`select_rows` does so once per
training step and touches no tensor but ``response_mask``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seal.episode import FIELD_NAMES, EpisodeResult
from seal.trainer.step_rules import StepSelection, select_trainable


def episode_results(batch: Any) -> list[EpisodeResult]:
    """The episode runner's record of every batch row (:meth:`EpisodeResult.from_fields` on the
    row's ``extra_fields`` columns), in row order.

    Raises:
        KeyError: an episode column is missing (the rollout did not use the SEAL loop).
    """
    ntb = batch.non_tensor_batch
    missing = [name for name in FIELD_NAMES if name not in ntb]
    if missing:
        raise KeyError(f"the training batch lacks the episode columns {missing}: the rollout did not use the SEAL "
                       "episode runner; set actor_rollout_ref.rollout.agent.default_agent_loop=seal")
    columns = {name: ntb[name] for name in FIELD_NAMES}
    return [EpisodeResult.from_fields({name: col[i] for name, col in columns.items()}) for i in range(len(batch))]


# The step's records and step-rule flags, computed by the first SEAL hook that sees the batch
# (:func:`select_rows`) and carried as columns that the later hooks read.
EPISODE_COLUMN = "seal_episode"
TRAINABLE_COLUMN = "seal_trainable"


def select_rows(batch: Any, *, n: int) -> tuple[list[EpisodeResult], StepSelection]:
    """The step's records and the step rules' selection (:mod:`seal.trainer.step_rules`:
    faults, prompts that did not fit, lone survivors of their GRPO group ``uid``).

    The first call on a batch reads the records (:func:`episode_results`) and applies the rules
    once, stores both as the ``seal_episode`` / ``seal_trainable`` columns and zeroes the
    ``response_mask`` rows left out, in place; later calls read the columns. Reads no reward,
    so it works right after rollout.
    """
    ntb = batch.non_tensor_batch
    if TRAINABLE_COLUMN not in ntb:
        results = episode_results(batch)
        groups = list(ntb["uid"] if "uid" in ntb else ntb["task_id"])
        selection = select_trainable([r.excluded for r in results], groups, n=n)
        ntb[EPISODE_COLUMN] = np.empty(len(results), dtype=object)
        ntb[EPISODE_COLUMN][:] = results
        ntb[TRAINABLE_COLUMN] = np.array(selection.trainable, dtype=bool)
        keep = torch.tensor(selection.trainable, dtype=torch.bool)
        mask = batch.batch["response_mask"]
        batch.batch["response_mask"] = mask * keep.to(mask.device).unsqueeze(-1).to(mask.dtype)
        return results, selection
    results = list(ntb[EPISODE_COLUMN])
    return results, StepSelection.from_flags(ntb[TRAINABLE_COLUMN].tolist(), [r.excluded for r in results])
