"""The advantage reweighters, registered by name, so an ablation or a new method is a config switch.

A reweighter ``fn(advantages (B, T), tags, *, cfg, weights, step) -> (advantages (B, T), metrics)``
is registered with its settings dataclass (``config``, built from ``seal.advantage.<name>``) and an
optional per-step ``prepare(cfg, step, capability, saved) -> (weights, state)``; the trainer keeps,
checkpoints and hands back ``state``. The contract is in docs/extending.md ("Adding a reweighter").
``seal.advantage.reweighter`` names the one applied; the lookups live in the package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from seal_shared.types import dataclass_from_mapping

__all__ = ["TAG_WEIGHTS", "Reweighter", "REWEIGHTERS", "register_reweighter", "unregister_reweighter"]

# The key of a reweighter's saved state under which it keeps adaptive per-tag weights.
TAG_WEIGHTS = "tag_weights"

Prepare = Callable[[Any, int, Any, Mapping[str, Any]], tuple[Mapping[str, float], dict[str, Any]]]


@dataclass(frozen=True)
class Reweighter:
    """One registered reweighter: its function, its config class and its per-step preparation."""

    name: str
    fn: Callable[..., Any]
    config: type | None = None
    prepare: Prepare | None = None

    def build_config(self, block: Mapping[str, Any] | None) -> Any:
        """The settings from the ``seal.advantage.<name>`` block (``None`` without a config class)."""
        if self.config is None:
            if block:
                raise ValueError(f"seal.advantage.{self.name}: this reweighter takes no settings, got {sorted(block)}")
            return None
        return dataclass_from_mapping(self.config, block, section=f"seal.advantage.{self.name}")

    def prepare_step(self, cfg: Any, step: int, capability: Any,
                     saved: Mapping[str, Any]) -> tuple[Mapping[str, float], dict[str, Any]]:
        """This step's ``weights`` argument and the state to keep (``{}`` and ``saved`` without a ``prepare``)."""
        if self.prepare is None:
            return {}, dict(saved)
        return self.prepare(cfg, step, capability, saved)


REWEIGHTERS: dict[str, Reweighter] = {}


def register_reweighter(name: str, *, config: type | None = None,
                        prepare: Prepare | None = None) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` under ``name``; a second registration of a name is an error."""

    def decorator(fn: Callable) -> Callable:
        if name in REWEIGHTERS and REWEIGHTERS[name].fn is not fn:
            raise ValueError(f"reweighter {name!r} is already registered; known: {sorted(REWEIGHTERS)}")
        REWEIGHTERS[name] = Reweighter(name, fn, config, prepare)
        return fn

    return decorator


def unregister_reweighter(name: str) -> None:
    """Remove a registered reweighter (for tests and plug-in reloads)."""
    del REWEIGHTERS[name]
