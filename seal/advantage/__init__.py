"""Advantage reweighting after GRPO: A-Patch and the reweighter registry.

The GRPO group advantages themselves are :mod:`seal.advantage.grpo`, which both trainers call.

The torch-free parts (``APatchConfig``, ``trajectory_scale``, ``update_dynamic_weights``, the
registry) load eagerly; the tensor functions, and with them the built-in reweighters they
register, load on first access or lookup, so importing the config does not import torch (the
environment service imports the core without torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from seal.advantage.dynamic import update_dynamic_weights
from seal.advantage.registry import REWEIGHTERS, TAG_WEIGHTS, Reweighter, register_reweighter
from seal.advantage.weights import APPLY_MODES, APatchConfig, BudgetConfig, DynamicConfig, trajectory_scale

# The reweighters the package registers when its torch module is imported.
BUILTIN_REWEIGHTERS = ("apatch", "identity")
_LAZY = {
    "apatch_reweight": "seal.advantage.apatch",
    "apply_scales": "seal.advantage.apatch",
    "budget_scales": "seal.advantage.apatch",
    "identity_reweight": "seal.advantage.apatch",
    "prepare_tag_weights": "seal.advantage.apatch",
}

__all__ = ["APPLY_MODES", "APatchConfig", "BUILTIN_REWEIGHTERS", "BudgetConfig", "DynamicConfig", "REWEIGHTERS",
           "TAG_WEIGHTS", "Reweighter", "get_reweighter", "get_reweighter_spec", "known_reweighters",
           "register_reweighter", "trajectory_scale", "update_dynamic_weights", *_LAZY]


def get_reweighter_spec(name: str) -> Reweighter:
    """The :class:`Reweighter` registered as ``name`` (``apatch`` or ``identity`` out of the box)."""
    # The built-in reweighters register themselves when their (torch) module is imported.
    from seal.advantage import apatch  # noqa: F401

    if name not in REWEIGHTERS:
        raise KeyError(f"unknown reweighter {name!r}; known: {sorted(REWEIGHTERS)}")
    return REWEIGHTERS[name]


def known_reweighters() -> list[str]:
    """The names of the registered reweighters, the built-ins included (without importing torch,
    so the config pass can check ``seal.advantage.reweighter`` before anything heavy loads)."""
    return sorted(set(REWEIGHTERS) | set(BUILTIN_REWEIGHTERS))


def get_reweighter(name: str) -> Callable:
    """The function of the reweighter registered as ``name``."""
    return get_reweighter_spec(name).fn


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seal.advantage' has no attribute {name!r}")
