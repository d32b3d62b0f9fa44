"""The per-episode ``params`` of a kit episode (``env_service.<name>`` in the config, ``/create`` ``params``
on the wire): :class:`EpisodeParams` and :class:`InterfaceParams`, whose interface blocks are type-checked
by :func:`check_block`.

``seal_shared.interface`` reads ``observation_lite``, ``tool_feedback_evolution`` and
``diagnostic_evolution`` into dataclasses and rejects unknown keys; here every known key is also
validated (and coerced, in pydantic's lax mode: ``"true"`` for a bool is fine) against the type of the
dataclass field it fills (:func:`seal_shared.interface.blocks.block_fields`), so ``/create`` answers one line naming the key instead of failing deep
inside the episode.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo, field_validator

from seal_shared.interface.blocks import block_fields

# Above the largest result and observation of the 800 BFCL tasks' ground truth (31,706 and 70,525
# characters, in long_context tasks), so faithful episodes are never cut.
DEFAULT_MAX_TOOL_RESULT_CHARS = 65_536
DEFAULT_MAX_OBSERVATION_CHARS = 262_144


class EpisodeParams(BaseModel):
    """The per-episode ``params`` every kit episode takes; unknown keys are refused by name. Subclass it
    to add an environment's own keys."""

    model_config = ConfigDict(extra="forbid")

    # The evaluation interface unless the caller asks for the training one ("sample"): a client
    # that leaves it out must never get training-time hints.
    rollout_mode: str = "validate"
    max_steps_per_turn: int = Field(10, ge=1)
    # Output caps (the release answered a 0.9 MB message with 360 MB).
    max_tool_result_chars: int = Field(DEFAULT_MAX_TOOL_RESULT_CHARS, ge=256, le=16_777_216,
                                       description="longer tool results are cut, with a marker")
    max_observation_chars: int = Field(DEFAULT_MAX_OBSERVATION_CHARS, ge=1024, le=67_108_864,
                                       description="longer observations are cut, with a marker")


class InterfaceParams(EpisodeParams):
    """:class:`EpisodeParams` plus the three interface-evolution blocks (each type-checked by key)."""

    observation_lite: dict[str, Any] | None = None
    tool_feedback_evolution: dict[str, Any] | None = None
    diagnostic_evolution: dict[str, Any] | None = None

    @field_validator("observation_lite", "tool_feedback_evolution", "diagnostic_evolution", mode="before")
    @classmethod
    def _interface_block(cls, v: Any, info: ValidationInfo) -> dict[str, Any] | None:
        return check_block(str(info.field_name), v)


@functools.cache
def _field_adapters(key: str) -> dict[str, TypeAdapter]:
    return {name: TypeAdapter(hint) for name, hint in block_fields(key).items()}


def check_block(key: str, block: Any) -> dict[str, Any] | None:
    """``block`` with its known keys type-checked; raises ``ValueError`` naming ``params.<key>.<field>``."""
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ValueError(f"params.{key} must be an object or null, got {type(block).__name__}")
    adapters = _field_adapters(key)
    out = dict(block)
    for name, value in block.items():
        adapter = adapters.get(name)
        if adapter is None:
            continue  # unknown keys are reported by the interface, with the list of known ones
        try:
            out[name] = adapter.validate_python(value)
        except ValidationError as err:
            first = err.errors()[0]
            where = "".join(f"[{p}]" for p in first.get("loc", ()))
            raise ValueError(f"params.{key}.{name}{where}: {first.get('msg', 'invalid value')} "
                             f"(got {type(value).__name__})") from None
    return out
