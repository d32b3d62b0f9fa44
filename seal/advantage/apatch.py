"""A-Patch: diagnosis-guided reweighting of GRPO advantages (docs/paper_map.md §2).

Each episode's advantage row is multiplied by a scale: the mean weight of its per-turn
failure tags, clipped to [min_scale, max_scale]. The weights are static base weights, or the
closed-loop weights that :mod:`seal.advantage.dynamic` moves toward prevalent, unsolved failure
tags each step. Everything here is pure: inputs are never
mutated, and the metrics come back as a dict under ``cfg.metric_prefix``.

The scale is applied after group normalisation, as in the release: a group whose rollouts all
got the same reward has zero advantages and is unaffected; otherwise the group no longer sums
to zero. That is the paper's method, kept deliberately (see docs/paper_map.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from seal.advantage.dynamic import step_dynamic_weights
from seal.advantage.registry import TAG_WEIGHTS, register_reweighter
from seal.advantage.weights import APatchConfig, BudgetConfig, trajectory_scale

__all__ = ["apatch_reweight", "apply_scales", "budget_scales", "identity_reweight", "prepare_tag_weights"]

Tags = Sequence[Sequence[str] | None]


def apply_scales(advantages: torch.Tensor, scales: torch.Tensor, apply_to: str) -> torch.Tensor:
    """Scale advantage rows. ``advantages`` ``(B, T)``, ``scales`` ``(B,)`` -> ``(B, T)``.

    ``all`` multiplies every entry of row i by ``scales[i]``; ``positive_advantage`` /
    ``negative_advantage`` scale only the entries with A > 0 / A < 0 and leave the rest as is.
    """
    s = scales.to(advantages.dtype).unsqueeze(-1)
    if apply_to == "all":
        return advantages * s
    if apply_to == "positive_advantage":
        return torch.where(advantages > 0, advantages * s, advantages)
    if apply_to == "negative_advantage":
        return torch.where(advantages < 0, advantages * s, advantages)
    raise ValueError(f"apply_to must be 'all', 'positive_advantage' or 'negative_advantage', got {apply_to!r}")


def budget_scales(scales: torch.Tensor, active: torch.Tensor, *, strength: float, min_scale: float, max_scale: float,
                  normalize_mean: bool, target_mean: float) -> torch.Tensor:
    """Squeeze the active scales toward 1 and optionally renormalise their mean. ``(B,)`` -> ``(B,)``.

    On active rows: s ← clip(1 + strength·(s − 1)); then, if ``normalize_mean``,
    s ← clip(s · target_mean / max(mean(s), 1e-6)), the mean taken over active rows.
    Inactive rows are returned unchanged. An explicit ``strength=0`` or ``target_mean=0`` is
    used as given.
    """
    out = scales.clone()
    if not bool(active.any()):
        return out
    s = torch.clamp(1.0 + strength * (scales[active] - 1.0), min_scale, max_scale)
    if normalize_mean:
        mean = float(s.mean())
        s = torch.clamp(s * (target_mean / max(mean, 1e-6)), min_scale, max_scale)
    out[active] = s
    return out


def prepare_tag_weights(cfg: APatchConfig, step: int, capability: Any | None = None,
                        saved: Mapping[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """A-Patch's per-step preparation (its registered ``prepare``): the weights for ``step`` and
    the state to keep, ``{"tag_weights": <the dynamic weights so far>}``.

    Dynamic and not in warm-up with a ``capability`` state: one EMA step from its tag statistics,
    starting from the weights ``saved`` the step before; those new weights are used and kept.
    Otherwise the static ``cfg.tag_weights``, and the kept weights stay as they were. During
    warm-up no dynamic update happens, as in the release.
    """
    kept = {str(t): float(w) for t, w in ((saved or {}).get(TAG_WEIGHTS) or {}).items()}
    if cfg.dynamic.enable and capability is not None and step >= cfg.warmup_steps:
        kept = step_dynamic_weights(kept, cfg, capability.tag_source())
        return dict(kept), {TAG_WEIGHTS: kept}
    return dict(cfg.tag_weights), {TAG_WEIGHTS: kept}


def _row_scales(tags: Tags, weights: Mapping[str, float], cfg: APatchConfig) -> tuple[list[float], list[bool]]:
    scales, active = [], []
    for row in tags:
        if not row:
            scales.append(1.0)
            active.append(False)
        else:
            scales.append(trajectory_scale(row, weights, min_scale=cfg.min_scale, max_scale=cfg.max_scale))
            active.append(True)
    return scales, active


def _tag_metrics(tags: Tags, weights: Mapping[str, float], prefix: str) -> dict[str, float]:
    counts = Counter(str(t) for row in tags if row for t in row)
    total = sum(counts.values())
    metrics = {f"{prefix}/tag_frac/{t}": n / total for t, n in counts.items()}
    for t in dict.fromkeys([*weights, *counts]):
        metrics[f"{prefix}/tag_weight/{t}"] = float(weights.get(t, 1.0))
    return metrics


def _skip_metrics(cfg: APatchConfig, *, enabled: bool, warmup: bool) -> dict[str, float]:
    p = cfg.metric_prefix
    return {f"{p}/enabled": float(enabled), f"{p}/warmup_skipped": float(warmup), f"{p}/scaled_count": 0.0}


def _check_inputs(advantages: torch.Tensor, tags: Tags) -> None:
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be (B, T), got shape {tuple(advantages.shape)}")
    if len(tags) != advantages.shape[0]:
        raise ValueError(f"got {len(tags)} tag lists for {advantages.shape[0]} advantage rows")


def _summary_metrics(cfg: APatchConfig, before: Sequence[float], after: Sequence[float],
                     active: Sequence[bool]) -> dict[str, float]:
    p, b = cfg.metric_prefix, cfg.budget
    kept_before = [s for s, a in zip(before, active) if a]
    kept_after = [s for s, a in zip(after, active) if a]
    n = len(kept_after)
    mean_before = sum(kept_before) / n if n else 1.0
    mean_after = sum(kept_after) / n if n else 1.0
    return {
        f"{p}/enabled": 1.0,
        f"{p}/warmup_skipped": 0.0,
        f"{p}/scaled_count": float(n),
        f"{p}/missing_tag_count": float(len(active) - n),
        f"{p}/mean_scale": mean_after,
        f"{p}/budget_enabled": float(b.enable),
        f"{p}/budget_mean_before": mean_before,
        f"{p}/budget_mean_after": mean_after,
        f"{p}/dynamic_enabled": float(cfg.dynamic.enable),
    }


@register_reweighter("apatch", config=APatchConfig, prepare=prepare_tag_weights)
def apatch_reweight(advantages: torch.Tensor, tags: Tags, *, cfg: APatchConfig, weights: Mapping[str, float],
                    step: int) -> tuple[torch.Tensor, dict[str, float]]:
    """Rescale each episode's row of ``advantages`` ``(B, T)`` (GRPO's, masked to assistant tokens)
    by its A-Patch scale, vectorised. ``tags``: ``B`` per-turn tag lists; ``None`` or empty means
    "no diagnosis" (scale 1, counted in ``missing_tag_count``). ``weights``: the active tag weights
    (:func:`prepare_tag_weights`). Returns new ``(B, T)`` advantages (the input is not modified)
    and metrics: ``mean_scale`` is the mean applied scale over tagged rows, after the budget;
    ``budget_mean_before`` keeps the pre-budget mean.
    """
    _check_inputs(advantages, tags)
    if not cfg.enable or step < cfg.warmup_steps:
        return advantages.clone(), _skip_metrics(cfg, enabled=cfg.enable, warmup=cfg.enable)
    base, active = _row_scales(tags, weights, cfg)
    scales = torch.tensor(base, dtype=torch.float64)
    if cfg.budget.enable:
        scales = _budget(scales, torch.tensor(active, dtype=torch.bool), cfg.budget)
    out = apply_scales(advantages, scales, cfg.apply_to)
    metrics = _summary_metrics(cfg, base, scales.tolist(), active)
    metrics.update(_tag_metrics(tags, weights, cfg.metric_prefix))
    return out, metrics


def _budget(scales: torch.Tensor, active: torch.Tensor, b: BudgetConfig) -> torch.Tensor:
    return budget_scales(scales, active, strength=b.strength, min_scale=b.min_scale, max_scale=b.max_scale,
                         normalize_mean=b.normalize_mean, target_mean=b.target_mean)


@register_reweighter("identity")
def identity_reweight(advantages: torch.Tensor, tags: Tags, *, cfg: APatchConfig | None, weights: Mapping[str, float],
                      step: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The no-A-Patch ablation: advantages unchanged (a copy), ``enabled`` reported as 0 (under
    ``cfg.metric_prefix``; the hook passes no settings, so the default ``seal/apatch``)."""
    _check_inputs(advantages, tags)
    prefix = cfg.metric_prefix if cfg is not None else APatchConfig.metric_prefix
    return advantages.clone(), {f"{prefix}/enabled": 0.0}

