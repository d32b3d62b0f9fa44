"""Which episodes of a training step the policy learns from: one rule for both backends.

An episode is left out of the update (its loss mask zeroed, its reward kept out of its GRPO
group's baseline) when

1. it is *excluded*: the environment or the LLM failed (``env_fault`` / ``llm_fault``), or the
   runner marked it ``excluded`` (its prompt did not fit the context); such an episode was not
   played to the end, so its reward says nothing about the policy;
2. it is a *lone survivor*: with ``n > 1`` rollouts per task, every other episode of its group
   was excluded. GRPO's baseline is the group mean; a group of one has none (verl's
   ``compute_grpo_outcome_advantage`` would give it its raw reward as advantage), so it carries
   no baseline-corrected signal.

A step whose episodes are all left out has nothing to train on: the trainers skip the update,
log a warning and count it in ``seal/skipped_updates``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXCLUSION_FIELDS = ("env_fault", "llm_fault", "excluded")


def is_excluded(episode: Any) -> bool:
    """Rule 1: an episode (a mapping or an object with those attributes) that faulted or that
    the runner excluded."""
    if isinstance(episode, Mapping):
        return any(bool(episode.get(f)) for f in EXCLUSION_FIELDS)
    return any(bool(getattr(episode, f, False)) for f in EXCLUSION_FIELDS)


@dataclass(frozen=True)
class StepSelection:
    """The outcome of the rules on one step's ``B`` episodes.

    ``trainable``: per episode, whether the update learns from it. ``excluded`` and
    ``lone_survivors`` count the episodes left out by rule 1 and rule 2.
    """

    trainable: tuple[bool, ...]
    excluded: int
    lone_survivors: int

    @property
    def num_trainable(self) -> int:
        return sum(self.trainable)

    @property
    def nothing_to_train(self) -> bool:
        return self.num_trainable == 0

    def metrics(self) -> dict[str, float]:
        """The step's ``seal/*`` selection metrics (the same names on both backends)."""
        return {
            "seal/episodes": float(len(self.trainable)),
            "seal/excluded_episodes": float(self.excluded),
            "seal/lone_survivors": float(self.lone_survivors),
            "seal/trained_episodes": float(self.num_trainable),
            "seal/skipped_updates": float(self.nothing_to_train),
        }


def select_trainable(excluded: Sequence[bool], groups: Sequence[Hashable], *, n: int) -> StepSelection:
    """Apply rules 1 and 2 to a step's episodes.

    Args:
        excluded: ``B`` flags of rule 1 (see :func:`is_excluded`).
        groups: ``B`` GRPO group ids (verl's ``uid``: one per task of the step).
        n: rollouts per task (``actor_rollout_ref.rollout.n``); rule 2 applies only when ``n > 1``.
    """
    if len(excluded) != len(groups):
        raise ValueError(f"{len(excluded)} exclusion flags for {len(groups)} group ids")
    kept_per_group = Counter(g for g, x in zip(groups, excluded) if not x)
    trainable = []
    lonely = 0
    for g, x in zip(groups, excluded):
        if x:
            trainable.append(False)
        elif n > 1 and kept_per_group[g] < 2:
            trainable.append(False)
            lonely += 1
        else:
            trainable.append(True)
    return StepSelection(tuple(trainable), excluded=sum(bool(x) for x in excluded), lone_survivors=lonely)
