"""The advantage reweighters, registered by name, so an ablation or a new method is a config switch.

A reweighter is a function ``fn(advantages (B, T), tags, *, cfg, weights, step) -> (advantages
(B, T), metrics)`` (see :func:`seal.advantage.apatch.apatch_reweight`) registered with

* ``config``: the dataclass of its settings, built from its own block ``seal.advantage.<name>``
  (unknown keys are errors; a missing block gives the defaults); ``cfg`` is that instance
  (``None`` for a reweighter without settings);
* ``prepare``: optionally ``prepare(cfg, step, state) -> weights``, called once per training step
  before ``fn`` with the capability state (its tag statistics, ``state.tag_source()``); what it
  returns is passed to ``fn`` as ``weights`` (``{}`` without one). A-Patch's dynamic tag-weight
  update is its ``prepare``.

``seal.advantage.reweighter`` names the one the trainers apply after GRPO.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from seal.types import dataclass_from_mapping

__all__ = ["Reweighter", "get_reweighter", "get_reweighter_spec", "register_reweighter", "unregister_reweighter"]


@dataclass(frozen=True)
class Reweighter:
    """One registered reweighter: its function, its config class and its per-step preparation."""

    name: str
    fn: Callable[..., Any]
    config: type | None = None
    prepare: Callable[[Any, int, Any], Mapping[str, float]] | None = None

    def build_config(self, block: Mapping[str, Any] | None) -> Any:
        """The settings from the ``seal.advantage.<name>`` block (``None`` without a config class)."""
        if self.config is None:
            if block:
                raise ValueError(f"seal.advantage.{self.name}: this reweighter takes no settings, got {sorted(block)}")
            return None
        return dataclass_from_mapping(self.config, block, section=f"seal.advantage.{self.name}")

    def weights(self, cfg: Any, step: int, state: Any) -> Mapping[str, float]:
        """This step's ``weights`` argument (``{}`` without a ``prepare``)."""
        return self.prepare(cfg, step, state) if self.prepare is not None else {}


REWEIGHTERS: dict[str, Reweighter] = {}


def register_reweighter(
    name: str, *, config: type | None = None, prepare: Callable[[Any, int, Any], Mapping[str, float]] | None = None
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


def get_reweighter_spec(name: str) -> Reweighter:
    """The :class:`Reweighter` registered as ``name`` (``apatch`` or ``identity`` out of the box)."""
    # The built-in reweighters register themselves when their module is imported.
    from seal.advantage import apatch  # noqa: F401

    if name not in REWEIGHTERS:
        raise KeyError(f"unknown reweighter {name!r}; known: {sorted(REWEIGHTERS)}")
    return REWEIGHTERS[name]


def get_reweighter(name: str) -> Callable:
    """The function of the reweighter registered as ``name``."""
    return get_reweighter_spec(name).fn
