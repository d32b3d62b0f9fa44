"""A small registry of advantage reweighters, so an ablation is a config switch.

A reweighter has the signature of :func:`seal.advantage.apatch.apatch_reweight`:
``fn(advantages (B, T), tags, *, cfg, weights, step) -> (advantages (B, T), metrics)``.
"""

from __future__ import annotations

from collections.abc import Callable

REWEIGHTERS: dict[str, Callable] = {}


def register_reweighter(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` under ``name``; a second registration of a name is an error."""

    def decorator(fn: Callable) -> Callable:
        if name in REWEIGHTERS and REWEIGHTERS[name] is not fn:
            raise ValueError(f"reweighter {name!r} is already registered; known: {sorted(REWEIGHTERS)}")
        REWEIGHTERS[name] = fn
        return fn

    return decorator


def get_reweighter(name: str) -> Callable:
    """The reweighter registered as ``name`` (``apatch`` or ``identity`` out of the box)."""
    # The built-in reweighters register themselves when their module is imported.
    from seal.advantage import apatch  # noqa: F401

    if name not in REWEIGHTERS:
        raise KeyError(f"unknown reweighter {name!r}; known: {sorted(REWEIGHTERS)}")
    return REWEIGHTERS[name]
