"""Advantage reweighting after GRPO: A-Patch and the reweighter registry.

The GRPO group advantages themselves are verl's ``compute_grpo_outcome_advantage``, which both
trainers call.

The torch-free parts (``APatchConfig``, ``trajectory_scale``, ``update_dynamic_weights``) load
eagerly; the tensor functions load on first access, so importing the config does not import
torch (the environment service imports the core without torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from seal.advantage.registry import Reweighter, get_reweighter, get_reweighter_spec, register_reweighter
from seal.advantage.weights import (
    APPLY_MODES,
    APatchConfig,
    BudgetConfig,
    DynamicConfig,
    trajectory_scale,
    update_dynamic_weights,
)

_LAZY = {
    "apatch_reweight": "seal.advantage.apatch",
    "apply_scales": "seal.advantage.apatch",
    "budget_scales": "seal.advantage.apatch",
    "identity_reweight": "seal.advantage.apatch",
    "resolve_tag_weights": "seal.advantage.apatch",
}

__all__ = [
    "APPLY_MODES",
    "APatchConfig",
    "BudgetConfig",
    "DynamicConfig",
    "Reweighter",
    "get_reweighter",
    "get_reweighter_spec",
    "register_reweighter",
    "trajectory_scale",
    "update_dynamic_weights",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seal.advantage' has no attribute {name!r}")
