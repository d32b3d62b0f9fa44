"""A-Patch written as plain loops over entries: the executable specification that
``test_seal_apatch`` checks the vectorised :func:`seal.advantage.apatch.apatch_reweight` against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from seal.advantage.apatch import _check_inputs, _row_scales, _skip_metrics, _summary_metrics, _tag_metrics
from seal.advantage.weights import APatchConfig, BudgetConfig

Tags = Sequence[Sequence[str] | None]


def _budget_reference(scales: list[float], active: list[bool], b: BudgetConfig) -> list[float]:
    out = list(scales)
    idx = [i for i, a in enumerate(active) if a]
    if not idx:
        return out
    for i in idx:
        out[i] = min(max(1.0 + b.strength * (out[i] - 1.0), b.min_scale), b.max_scale)
    if b.normalize_mean:
        factor = b.target_mean / max(sum(out[i] for i in idx) / len(idx), 1e-6)
        for i in idx:
            out[i] = min(max(out[i] * factor, b.min_scale), b.max_scale)
    return out


def apatch_reweight_reference(
    advantages: torch.Tensor,
    tags: Tags,
    *,
    cfg: APatchConfig,
    weights: Mapping[str, float],
    step: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The same computation as :func:`apatch_reweight`, written as plain loops over entries."""
    _check_inputs(advantages, tags)
    if not cfg.enable or step < cfg.warmup_steps:
        return advantages.clone(), _skip_metrics(cfg, enabled=cfg.enable, warmup=cfg.enable)
    base, active = _row_scales(tags, weights, cfg)
    scales = _budget_reference(base, active, cfg.budget) if cfg.budget.enable else list(base)
    rows = advantages.tolist()
    for i, row in enumerate(rows):
        s = float(torch.tensor(scales[i], dtype=torch.float64).to(advantages.dtype))
        for j, a in enumerate(row):
            touch = (
                cfg.apply_to == "all"
                or (cfg.apply_to == "positive_advantage" and a > 0)
                or (cfg.apply_to == "negative_advantage" and a < 0)
            )
            row[j] = a * s if touch else a
    out = torch.tensor(rows, dtype=advantages.dtype)
    metrics = _summary_metrics(cfg, base, scales, active)
    metrics.update(_tag_metrics(tags, weights, cfg.metric_prefix))
    return out, metrics
