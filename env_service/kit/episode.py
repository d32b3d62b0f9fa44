"""The base episode of the kit: the protocol loop, with the environment's tools and check as hooks.

Protocol (the BFCL episode's, so the same episode runner, prompt format and interface apply):
``reset()`` gives ``[system, first user message]`` (the task's tool docs in the ``bfcl_qwen_fc``
``<tools>`` system prompt, plus the interface's system blocks); ``step(text)`` parses the tool calls
(the project's safe ``xml_json`` parser, or the environment's own :meth:`ToolEpisode.parse`), runs
them on this episode's world and answers ``<tool_response>`` blocks; a reply without calls ends the
turn (the next user message, or ``[CONVERSATION_COMPLETED]`` after the last); a turn with more
tool-calling steps than ``max_steps_per_turn`` ends the episode; ``evaluate(sparse)`` runs the
per-turn check on the accepted calls and builds the evaluation
(:func:`~env_service.kit.evaluation.build_evaluation`).

Interface evolution (:class:`seal_shared.interface.EpisodeInterface`) is applied here: observation hints on
the tool docs and the system blocks at ``reset``, recovery hints after a rejected message and after
each failed call (``ToolResult.failed``: the world's declared rule, never a guess from the text).
It reads the ``observation_lite`` / ``tool_feedback_evolution`` / ``diagnostic_evolution`` blocks of
the params; the environment honours those its ``params_model`` declares (:class:`InterfaceParams`
declares all three, :class:`EpisodeParams` none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from env_service.bfcl.interface_params import check_block
from env_service.bfcl.parsers import ParseResult, parse_tool_calls
from env_service.bfcl.prompts import (
    CONVERSATION_COMPLETED, call_to_string, render_initial_messages, render_invalid_tool_call,
    render_tool_responses,
)
from env_service.kit.evaluation import TurnCheck, World, build_evaluation, replay_turns
from env_service.kit.tasks import Task
from seal_shared.interface import EpisodeInterface
from seal_shared.interface.blocks import INTERFACE_BLOCKS


class EpisodeParams(BaseModel):
    """The per-episode ``params`` every kit episode takes (``env_service.<name>`` in the config);
    unknown keys are refused by name. Subclass it to add an environment's own keys."""

    model_config = ConfigDict(extra="forbid")

    rollout_mode: str = "validate"  # the evaluation interface unless the caller asks for "sample"
    max_steps_per_turn: int = Field(10, ge=1)


class InterfaceParams(EpisodeParams):
    """:class:`EpisodeParams` plus the three interface-evolution blocks (each type-checked by key)."""

    observation_lite: dict[str, Any] | None = None
    tool_feedback_evolution: dict[str, Any] | None = None
    diagnostic_evolution: dict[str, Any] | None = None

    @field_validator("observation_lite", "tool_feedback_evolution", "diagnostic_evolution", mode="before")
    @classmethod
    def _interface_block(cls, v: Any, info: ValidationInfo) -> dict[str, Any] | None:
        return check_block(str(info.field_name), v)


@dataclass
class StepOutcome:
    """One ``step``'s answer; the host scores a terminated episode with ``evaluate(True)``."""

    observation: str
    terminated: bool
    info: dict[str, Any] = field(default_factory=dict)


class ToolEpisode:
    """One rollout of one task (see the module docstring). An environment subclasses it and gives
    :meth:`start` (a fresh world); :meth:`check_turns` and :meth:`parse` have defaults."""

    params_model: ClassVar[type[EpisodeParams]] = InterfaceParams
    tool_call_parser: ClassVar[str] = "xml_json"  # the project's parser mode (and the hints' call syntax)
    prompt_mode: ClassVar[str] = "bfcl_qwen_fc"

    def __init__(self, task: Task, params: EpisodeParams | dict[str, Any] | None = None) -> None:
        self.task = task
        self.params = params if isinstance(params, self.params_model) else self.params_model.model_validate(params or {})
        self.interface = EpisodeInterface.from_params(self.params.model_dump(), category=task.category)
        self._initial: list[dict[str, str]] | None = self._start()

    # ----- the environment's part ------------------------------------------------------------
    def start(self) -> World:
        """A fresh world for this task: ``run(call string) -> ToolResult`` and ``state()``."""
        raise NotImplementedError(f"{type(self).__name__} must define start(), the task's fresh world")

    def check_turns(self) -> list[TurnCheck]:
        """The per-turn check: one :class:`TurnCheck` per ground-truth turn (default: replay on fresh worlds)."""
        return replay_turns(self.model_turns, self.task.gt_turns, self.start)

    def parse(self, content: str) -> ParseResult:
        """The calls of an assistant message, or why it is refused (strict: any error refuses all)."""
        return parse_tool_calls(content, self.tool_call_parser, strict=True)

    @classmethod
    def check_params(cls, block: dict[str, Any]) -> None:
        """Validate a config's params block (``ValueError`` naming the key)."""
        cls.params_model.model_validate(block)

    @classmethod
    def interface_blocks(cls) -> tuple[str, ...]:
        """The interface-evolution blocks this episode honours: those its ``params_model`` has."""
        return tuple(b for b in INTERFACE_BLOCKS if b in cls.params_model.model_fields)

    # ----- the protocol ----------------------------------------------------------------------
    def _start(self) -> list[dict[str, str]]:
        self.world = self.start()
        self.tools = self.interface.transform_tools(self.task.tools)
        self.offered = [t["name"] for t in self.tools]
        self.model_turns: list[list[list[str]]] = [[]]
        self.turn = self.steps_in_turn = 0
        self.terminated = False
        self.terminated_reason: str | None = None
        return render_initial_messages(self.prompt_mode, self.tools, self.task.user_turns[0],
                                       self.interface.system_blocks())

    def reset(self) -> list[dict[str, str]]:
        """Start (or restart) the episode; returns ``[system, first user]`` (the constructor's start is
        reused when nothing happened since)."""
        if self._initial is None:
            self._initial = self._start()
        messages, self._initial = self._initial, None
        return messages

    def step(self, content: str) -> StepOutcome:
        """Apply one assistant message; returns the next observation."""
        if self.terminated:
            raise ValueError(f"episode of {self.task.id} has terminated ({self.terminated_reason}); create a new one")
        self._initial = None
        parsed = self.parse(content)
        if parsed.errors:
            return self._reject(" ".join(parsed.errors), "parse_error")
        if not parsed.calls:
            return self._advance()
        unavailable = [c.name for c in parsed.calls if c.name not in self.offered]
        if unavailable:
            return self._reject(f"Tool '{unavailable[0]}' is not available in the current tool list.",
                                "unavailable_tool")
        calls = [call_to_string(c.name, c.arguments) for c in parsed.calls]
        results = [self.world.run(call) for call in calls]
        self.model_turns[self.turn].append(calls)
        self.steps_in_turn += 1
        hints = [self.interface.tool_error_feedback(r.text, tool_names=self.offered) if r.failed else ""
                 for r in results]
        if self.steps_in_turn > self.params.max_steps_per_turn:
            self._end("max_steps_per_turn")
            return self._outcome(CONVERSATION_COMPLETED, {"force_terminated": True})
        return self._outcome(render_tool_responses([r.text for r in results], hints),
                             {"tool_calls": len(calls), "tool_errors": sum(r.failed for r in results)})

    def _reject(self, reason: str, error_type: str) -> StepOutcome:
        hint = self.interface.parse_error_feedback(reason, parser_mode=self.tool_call_parser, tool_names=self.offered)
        return self._outcome(render_invalid_tool_call(reason, hint), {"error_type": error_type})

    def _advance(self) -> StepOutcome:
        if self.turn + 1 >= len(self.task.user_turns):
            self._end("completed")
            return self._outcome(CONVERSATION_COMPLETED, {"turn_advanced": True})
        self.turn += 1
        self.steps_in_turn = 0
        self.model_turns.append([])
        return self._outcome(self.task.user_turns[self.turn], {"turn_advanced": True})

    def _end(self, reason: str) -> None:
        self.terminated, self.terminated_reason = True, reason

    def _outcome(self, observation: str, info: dict[str, Any]) -> StepOutcome:
        info.update(turn=self.turn, steps_in_turn=self.steps_in_turn, terminated_reason=self.terminated_reason,
                    observation_role="user")
        return StepOutcome(observation, self.terminated, info)

    def evaluate(self, sparse: bool = True) -> float | dict[str, Any]:
        """The accuracy (``sparse``) or the evaluation dict with the episode's own fields."""
        result = build_evaluation(self.check_turns(), played_turns=len(self.model_turns))
        if sparse:
            return result["accuracy"]
        return {**result, "task_id": self.task.id, "test_id": self.task.id, "category": self.task.category,
                "turn_count": self.turn + 1, "num_turns": len(self.task.user_turns),
                "completed": self.terminated_reason == "completed", "terminated_reason": self.terminated_reason,
                "model_turns": [[list(step) for step in turn] for turn in self.model_turns]}

    def info(self) -> dict[str, Any]:
        """A small JSON-safe summary of where the episode stands."""
        return {"task_id": self.task.id, "category": self.task.category, "turn": self.turn,
                "num_turns": len(self.task.user_turns), "steps_in_turn": self.steps_in_turn,
                "terminated": self.terminated, "terminated_reason": self.terminated_reason,
                "tools": list(self.offered), "observation_role": "user"}
