"""The closed-loop (EMA) update of the A-Patch tag weights, from tag statistics.

A-Patch's per-step preparation (:func:`seal.advantage.apatch.prepare_tag_weights`) calls
:func:`step_dynamic_weights` once per training step with the capability state's tag statistics
(``CapabilityState.tag_source()``: the epoch window's, else the run's) and the previous weights;
the result is the state A-Patch hands the trainer to keep, save and resume.
:func:`update_dynamic_weights` is the formula itself (docs/paper_map.md §2), on plain counts and means. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from seal.advantage.weights import APatchConfig, clip
from seal_shared.tags import excluded_tags
from seal_shared.types import FailureTag


class TagStats(Protocol):
    """The statistics of one tag the update reads (``seal.diagnosis.CapabilityStats`` has them)."""

    count: int

    @property
    def reward_mean(self) -> float: ...


def step_dynamic_weights(previous: Mapping[str, float], cfg: APatchConfig,
                         tag_stats: Mapping[str, TagStats]) -> dict[str, float]:
    """One EMA step from ``tag_stats`` (tag -> count, reward mean), with ``cfg.tag_weights`` as
    the base weights and ``cfg.dynamic`` / the scale range as the knobs."""
    d = cfg.dynamic
    return update_dynamic_weights(previous, cfg.tag_weights, {t: s.count for t, s in tag_stats.items()},
                                  {t: s.reward_mean for t, s in tag_stats.items()}, ema_beta=d.ema_beta,
                                  prevalence_alpha=d.prevalence_alpha, confidence_samples=d.confidence_samples,
                                  min_scale=cfg.min_scale, max_scale=cfg.max_scale)


def update_dynamic_weights(previous: Mapping[str, float], base: Mapping[str, float],
                           tag_counts: Mapping[str, int | float], tag_reward_mean: Mapping[str, float], *,
                           ema_beta: float, prevalence_alpha: float, confidence_samples: int, min_scale: float,
                           max_scale: float) -> dict[str, float]:
    """One EMA step of the closed-loop tag weights.

    With N = the summed counts of the non-excluded tags (``pass`` and ``unknown`` included),
    each tag t in base ∪ counts ∪ previous moves toward

        target_t = 1                                            (excluded tags)
                 = b_t                                          (pass)
                 = b_t · (1 + α · (n_t/N) · (1 − r̄_t) · min(1, n_t/C))   (otherwise)

    clipped to [min_scale, max_scale], via w_t = (1 − β)·previous_t + β·target_t, where
    previous_t defaults to b_t = base.get(t, 1.0). β is clamped to [0, 1]; C = max(1, int(C)).
    N = 0 returns ``dict(base)``. Every knob is used as given: an explicit 0 means 0.
    """
    excluded = excluded_tags()
    total = sum(float(n) for t, n in tag_counts.items() if t not in excluded)
    if total <= 0:
        return {str(t): float(w) for t, w in base.items()}
    beta = clip(float(ema_beta), 0.0, 1.0)
    conf = max(1, int(confidence_samples))
    out: dict[str, float] = {}
    for tag in dict.fromkeys([*base, *tag_counts, *previous]):
        b = float(base.get(tag, 1.0))
        if tag in excluded:
            target = 1.0
        elif tag == FailureTag.PASS:
            target = b
        else:
            n = float(tag_counts.get(tag, 0))
            reward_mean = float(tag_reward_mean.get(tag, 0.0))
            target = b * (1.0 + prevalence_alpha * (n / total) * (1.0 - reward_mean) * min(1.0, n / conf))
        target = clip(target, min_scale, max_scale)
        out[str(tag)] = (1.0 - beta) * float(previous.get(tag, b)) + beta * target
    return out
