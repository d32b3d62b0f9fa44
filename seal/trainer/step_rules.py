"""Which episodes of a training step the policy learns from: one rule for both backends.

An episode is left out of the update (loss mask zeroed, reward kept out of its GRPO group's
baseline) when it is *excluded* (:attr:`seal.episode.EpisodeResult.excluded`: a fault, a prompt
that did not fit, nothing written) or a *lone survivor* (``n > 1`` and every other episode of its
group was excluded: a group of one has no baseline). A step with nothing left skips the update
(``seal/skipped_updates``). The table of cases is in docs/paper_map.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from seal.episode import EpisodeResult


@dataclass(frozen=True)
class StepSelection:
    """The outcome of the rules on one step's ``B`` episodes.

    ``trainable``: per episode, whether the update learns from it. ``excluded`` and
    ``lone_survivors`` count the episodes left out by rule 1 and rule 2.
    """

    trainable: tuple[bool, ...]
    excluded: int
    lone_survivors: int

    @classmethod
    def from_flags(cls, trainable: Sequence[bool], excluded: Sequence[bool]) -> StepSelection:
        """The selection with these per-episode flags: every episode left out that rule 1 did
        not exclude is a lone survivor."""
        return cls(tuple(bool(t) for t in trainable), excluded=sum(bool(x) for x in excluded),
                   lone_survivors=sum(not t and not x for t, x in zip(trainable, excluded)))

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
        excluded: ``B`` flags of rule 1 (:attr:`seal.episode.EpisodeResult.excluded`).
        groups: ``B`` GRPO group ids (verl's ``uid``: one per task of the step).
        n: rollouts per task (``actor_rollout_ref.rollout.n``); rule 2 applies only when ``n > 1``.
    """
    if len(excluded) != len(groups):
        raise ValueError(f"{len(excluded)} exclusion flags for {len(groups)} group ids")
    kept_per_group = Counter(g for g, x in zip(groups, excluded) if not x)
    trainable = [not x and (n <= 1 or kept_per_group[g] >= 2) for g, x in zip(groups, excluded)]
    return StepSelection.from_flags(trainable, excluded)


def episode_metrics(results: Sequence[EpisodeResult]) -> dict[str, float]:
    """The step's episode metrics, under the same ``seal/*`` names on both backends: fault and
    truncation counts over all episodes, means over the played (not excluded) ones. The episode
    counts themselves are :meth:`StepSelection.metrics`'."""
    out = {
        "seal/env_faults": float(sum(r.env_fault for r in results)),
        "seal/llm_faults": float(sum(r.llm_fault for r in results)),
        "seal/truncated_episodes": float(sum(r.truncated_response_tokens > 0 for r in results)),
    }
    played = [r for r in results if not r.excluded]
    if played:
        n = len(played)
        out.update({
            "seal/reward_mean": sum(r.reward for r in played) / n,
            "seal/success_rate": sum(r.valid for r in played) / n,
            "seal/num_llm_calls_mean": sum(r.num_llm_calls for r in played) / n,
            "seal/response_tokens_mean": sum(r.num_response_tokens for r in played) / n,
            "seal/tagged_episodes": float(sum(bool(r.tags) for r in played)),
        })
    return out


def signal_metrics(rewards: Sequence[float], groups: Sequence[Hashable], trainable: Sequence[bool]) -> dict[str, float]:
    """How much a step has to learn from: ``seal/groups_with_reward_spread`` counts the GRPO
    groups whose trained episodes' rewards differ (only those give non-zero advantages);
    ``seal/groups`` counts the groups with a trained episode."""
    by_group: dict[Hashable, set[float]] = {}
    for reward, group, keep in zip(rewards, groups, trainable):
        if keep:
            by_group.setdefault(group, set()).add(float(reward))
    return {"seal/groups": float(len(by_group)),
            "seal/groups_with_reward_spread": float(sum(len(r) > 1 for r in by_group.values()))}
