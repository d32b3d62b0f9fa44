"""The advantage reweighters, registered by name, so an ablation or a new method is a config switch.

A reweighter is a function ``fn(advantages (B, T), tags, *, cfg, weights, step) -> (advantages
(B, T), metrics)`` (see :func:`seal.advantage.apatch.apatch_reweight`) registered with

* ``config``: the dataclass of its settings, built from its own block ``seal.advantage.<name>``
  (unknown keys are errors; a missing block gives the defaults); ``cfg`` is that instance
  (``None`` for a reweighter without settings);
* ``prepare``: optionally ``prepare(cfg, step, capability, saved) -> (weights, state)``, called
  once per training step before ``fn``. ``capability`` is the capability state (its tag
  statistics: ``capability.tag_source()``; ``None`` when SEAL is off); ``saved`` is the state
  it returned the step before (``{}`` at the start of a run; restored from the checkpoint on
  resume). ``weights`` is passed to ``fn``; ``state``, a JSON-safe dict, is what the trainer
  keeps, saves with each checkpoint and hands back next step. A reweighter that adapts per-tag
  weights keeps them under :data:`TAG_WEIGHTS`; the trainer logs those
  (``seal/diagnosis/dynamic_tag_weight/<tag>``) and writes them in each epoch dump.
  A-Patch's dynamic tag-weight update is its ``prepare``.

``seal.advantage.reweighter`` names the one the trainers apply after GRPO. The lookups
(:func:`seal.advantage.get_reweighter_spec`) live in the package, which also loads the built-in
reweighters (``apatch``, ``identity``) on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from seal.types import dataclass_from_mapping

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

    def prepare_step(
        self, cfg: Any, step: int, capability: Any, saved: Mapping[str, Any]
    ) -> tuple[Mapping[str, float], dict[str, Any]]:
        """This step's ``weights`` argument and the state to keep (``{}`` and ``saved`` without a ``prepare``)."""
        if self.prepare is None:
            return {}, dict(saved)
        return self.prepare(cfg, step, capability, saved)


REWEIGHTERS: dict[str, Reweighter] = {}


def register_reweighter(
    name: str, *, config: type | None = None, prepare: Prepare | None = None
) -> Callable[[Callable], Callable]:
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
