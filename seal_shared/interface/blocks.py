"""The interface-evolution blocks of an environment's params, and which ones an environment honours.

An environment's per-episode params (``env_service.<env>`` in the config, ``/create`` ``params`` on
the wire) may carry three blocks: ``observation_lite`` (schema hints), ``tool_feedback_evolution``
(recovery hints) and ``diagnostic_evolution`` (guideline lines). Only an episode that applies them
through :class:`seal_shared.interface.EpisodeInterface` gives them an effect, so each environment declares
the blocks it honours (``env_service.registry.Environment.interface_blocks``). Turning on a block
the environment does not honour, or misspelling a key inside any block, fails here with one line
naming the key, rather than training silently without the interface evolution the config asked for
(the config's check: ``seal.config_check.check_interface``).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping
from typing import Any

INTERFACE_BLOCKS = ("observation_lite", "tool_feedback_evolution", "diagnostic_evolution")


@functools.cache
def block_fields(name: str) -> dict[str, Any]:
    """The keys a block may hold and their types: its dataclass's fields (``diagnostic_evolution`` adds
    the trainer's guideline-selection settings and the release's ``category_tags``)."""
    from seal_shared.interface.episode import DiagnosticEvolutionParams, ObservationLiteParams, ToolFeedbackParams
    from seal_shared.interface.guidelines import GuidelineConfig

    classes = {"observation_lite": (ObservationLiteParams,), "tool_feedback_evolution": (ToolFeedbackParams,),
               "diagnostic_evolution": (DiagnosticEvolutionParams, GuidelineConfig)}[name]
    fields: dict[str, Any] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            fields.setdefault(f.name, hints[f.name])
    if name == "diagnostic_evolution":
        fields["category_tags"] = bool  # the release's name for per_category
    return fields


def block_keys(name: str) -> tuple[str, ...]:
    """The keys a block may hold (:func:`block_fields`)."""
    return tuple(block_fields(name))


def check_block_names(names: Iterable[str], *, owner: str) -> tuple[str, ...]:
    """``names`` as a tuple, each one of :data:`INTERFACE_BLOCKS` (``ValueError`` naming ``owner`` otherwise)."""
    out = tuple(names)
    for name in out:
        if name not in INTERFACE_BLOCKS:
            raise ValueError(f"{owner}: {name!r} is not an interface block (known: {', '.join(INTERFACE_BLOCKS)})")
    return out


def _is_on(value: Any) -> bool:
    """``enable`` as the environments read it (pydantic's lax bool: ``true``, ``1``, ``"yes"`` ...)."""
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "t", "yes", "y", "on"}
    return value is True or (isinstance(value, int) and value == 1)


def enabled_blocks(params: Mapping[str, Any]) -> list[str]:
    """The interface blocks of ``params`` whose ``enable`` is on."""
    return [name for name in INTERFACE_BLOCKS
            if isinstance(params.get(name), Mapping) and _is_on(params[name].get("enable"))]


def unhonoured_message(block: str, env: str, honoured: Iterable[str], where: str) -> str:
    """The one line for a block turned on that environment ``env`` does not honour."""
    honours = ", ".join(honoured) or "no interface block"
    return (f"{where}.{block}.enable=true: the {env!r} environment does not honour {block} (it honours {honours}), "
            "so the block would change nothing (fix: drop the block or set enable: false, or use an environment "
            "that declares it in Environment.interface_blocks)")
