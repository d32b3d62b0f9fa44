"""The kit's episode: the protocol loop, with the environment's world, parsing, check and hooks.

The protocol is the release's BFCL protocol, so the same episode runner, prompt formats and interface
apply to every environment; ``docs/extending.md`` ("The contract") states it, its hooks and each
step's ``info``. Interface evolution (:class:`seal_shared.interface.EpisodeInterface`, built from the
params' blocks) is applied here: observation hints on the tool docs and the system blocks at
``reset``, recovery hints after a refused message and after each failed call.

An episode is not thread-safe: one caller drives it at a time. It shares nothing mutable with other
episodes (the task's data is read-only; its world is its own).
"""

from __future__ import annotations

import keyword
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from env_service.kit.evaluation import (
    FORCE_TERMINATED, TurnCheck, TurnVerdict, World, build_evaluation, replay_turns, turn_failure,
)
from env_service.kit.oracle import oracle_messages
from env_service.kit.params import EpisodeParams, InterfaceParams
from env_service.kit.parsers import ParseResult, ToolCall, parse_tool_calls
from env_service.kit.prompts import (
    CONVERSATION_COMPLETED, observation_role, render_initial_messages, render_invalid_tool_call, render_tool_responses,
)
from env_service.kit.tasks import Task
from seal_shared.calls import ERROR_PREFIX, call_to_string
from seal_shared.interface import EpisodeInterface
from seal_shared.interface.blocks import INTERFACE_BLOCKS

# The calls of one message together: under the service's 60 s worker watchdog, so that a message of
# many slow calls gets its remaining calls refused instead of its worker (and episodes) killed.
STEP_TIME_BUDGET_S = 20.0
_MAX_ERROR_MESSAGES = 50
_MAX_ERROR_CHARS = 300
EVENTS = ("parse_errors", "rejected_calls", "unavailable_tool_calls", "tool_errors", "tool_calls_attempted",
          "tool_calls_accepted", "steps", "assistant_messages")


class EpisodeTerminatedError(ValueError):
    """``step`` on an episode that has already ended (a caller error, hence a ``ValueError``)."""


class Interface(Protocol):
    """The part of :class:`seal_shared.interface.EpisodeInterface` the episode uses (tests pass stand-ins)."""

    def transform_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def system_blocks(self) -> list[str]: ...
    def parse_error_feedback(self, reason: str, *, parser_mode: str, tool_names: list[str]) -> str: ...
    def tool_error_feedback(self, error_text: str, *, tool_names: list[str]) -> str: ...


@dataclass
class StepOutcome:
    """One ``step``'s answer; the host scores a terminated episode with ``evaluate(True)``."""

    observation: str
    terminated: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnEventCounts:
    """Per-ground-truth-turn events, reported as the evaluation's ``turn_events``."""

    parse_errors: int = 0
    unavailable_tools: int = 0
    tool_errors: int = 0
    model_calls: list[str] = field(default_factory=list)


def truncate(text: str, limit: int, what: str, param: str) -> str:
    """``text`` cut to ``limit`` characters plus a one-line marker naming the cut and the param to raise."""
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}\n[truncated: {what} had {len(text)} characters; shown {limit} "
            f"(episode param {param})]")


class ToolEpisode:
    """One rollout of one task (the protocol: ``docs/extending.md``). An environment subclasses it and gives
    :meth:`start` (its world); every other hook has a default.

    The class attributes fix the protocol's choices: the call syntax of :meth:`parse` and the recovery
    hints (``tool_call_parser``: ``xml_json``, ``python_list`` or ``llama3_json``), the prompt and
    result formats (``prompt_mode``, ``tool_result_mode``), whether calls to tools not offered are
    refused and whether a refused message ends the episode. An environment may make any of them a
    property of its params (BFCL does).
    """

    params_model: ClassVar[type[EpisodeParams]] = InterfaceParams
    tool_call_parser: ClassVar[str] = "xml_json"
    prompt_mode: ClassVar[str] = "bfcl_qwen_fc"
    tool_result_mode: ClassVar[str] = "bfcl_tool_response"
    enforce_available_tools: ClassVar[bool] = True
    terminate_on_parse_error: ClassVar[bool] = False

    def __init__(self, task: Task, params: EpisodeParams | dict[str, Any] | None = None, *,
                 interface: Interface | None = None) -> None:
        self.task = task
        self.params = params if isinstance(params, self.params_model) else self.params_model.model_validate(params or {})
        self.interface: Interface = interface if interface is not None else EpisodeInterface.from_params(
            self.params.model_dump(), category=task.category)
        self._initial = self._start()
        self._pristine = True

    # ----- the environment's part ------------------------------------------------------------
    def start(self) -> World:
        """A fresh world for this task: ``run(call string) -> ToolResult`` (and ``state()`` for the default check)."""
        raise NotImplementedError(f"{type(self).__name__} must define start(), the task's fresh world")

    def parse(self, content: str) -> ParseResult:
        """The calls of an assistant message, or why it is refused (strict: any error refuses all)."""
        return parse_tool_calls(content, self.tool_call_parser, strict=True)

    def check_turns(self) -> list[TurnCheck]:
        """The per-turn check: one :class:`TurnCheck` per ground-truth turn (default: replay on fresh worlds)."""
        return replay_turns(self.model_turns, self.task.gt_turns, self.start)

    def judge_turn(self, check: TurnCheck, index: int) -> TurnVerdict:
        """The verdict hook: why turn ``index`` fails the episode, or ``None`` (default: :func:`turn_failure`)."""
        return turn_failure(check.evidence, index)

    def turn_message(self, turn: int) -> tuple[str, dict[str, Any]]:
        """The message that opens ``turn`` and what it adds to the step's ``info`` (default: the task's
        user message). BFCL's held-out tools are revealed here."""
        return self.task.user_turns[turn], {}

    def stop_after_turn(self) -> str | None:
        """A reason to end the episode when the model ends a turn before the last (``None``: go on).
        BFCL's open queries end after the first."""
        return None

    def evaluation_fields(self, result: dict[str, Any]) -> dict[str, Any]:
        """The episode's own fields of the evaluation, beside ``result`` (the checker's)."""
        return {
            "task_id": self.task.id, "test_id": self.task.id, "category": self.task.category,
            "turn_count": self.turn + 1, "num_turns": len(self.task.gt_turns), "completed": self.completed,
            "terminated_reason": self.terminated_reason, "force_zero_reward": self.force_zero_reward,
            "events": dict(self.events),
            "turn_events": [{"parse_errors": e.parse_errors, "unavailable_tools": e.unavailable_tools,
                             "tool_errors": e.tool_errors, "model_calls": list(e.model_calls),
                             "gt_calls": [c.split("(", 1)[0].strip() for c in gt]}
                            for e, gt in zip(self.turn_events, self.task.gt_turns)],
            "error_messages": list(self.error_messages),
            "model_turns": [[list(step) for step in turn] for turn in self.model_turns],
        }

    @classmethod
    def tool_parameters(cls, tasks: Iterable[Task]) -> dict[str, list[str]]:
        """Each tool's parameter names in order (default: as its JSON doc lists them, over ``tasks``),
        which name a call string's positional arguments."""
        table: dict[str, list[str]] = {}
        for task in tasks:
            for doc in getattr(task, "tools", None) or ():
                table.setdefault(str(doc["name"]), list((doc.get("parameters") or {}).get("properties") or {}))
        return table

    @classmethod
    def oracle(cls, task: Task, *, parser: str = "xml_json") -> list[str]:
        """The assistant messages that play ``task``'s ground truth through the protocol, in ``parser``'s
        call syntax (:mod:`env_service.kit.oracle`; positional arguments named by :meth:`tool_parameters`)."""
        return oracle_messages(task.gt_turns, cls.tool_parameters([task]), parser=parser)

    @classmethod
    def judge_turns(cls, task: Task, model_turns: list[list[list[str]]]) -> dict[str, Any]:
        """The per-turn check and verdict on ``model_turns`` (turn -> step -> call strings) for
        ``task``, offline: the evaluation an episode that made these calls gets, without its own fields."""
        episode = cls(task)
        episode._turns = [[list(step) for step in turn] for turn in model_turns]
        return build_evaluation(episode.check_turns(), played_turns=len(model_turns), judge=episode.judge_turn)

    @classmethod
    def check_params(cls, block: dict[str, Any]) -> None:
        """Validate a config's params block (``ValueError`` naming the key)."""
        cls.params_model.model_validate(block)

    @classmethod
    def interface_blocks(cls) -> tuple[str, ...]:
        """The interface-evolution blocks this episode honours: those its ``params_model`` has."""
        return tuple(b for b in INTERFACE_BLOCKS if b in cls.params_model.model_fields)

    # ----- state ------------------------------------------------------------------------------
    @property
    def model_turns(self) -> list[list[list[str]]]:
        """The model's accepted calls so far, turn -> step -> call strings (BFCL's checker form:
        ``[[["cd(folder='x')", "ls()"], ["mv(...)"]], [], ...]``), one list per turn played, the
        current one included. What :meth:`check_turns` judges; read it, never change it."""
        return self._turns

    @property
    def observation_role(self) -> str:
        """The chat role of this episode's observations: ``ipython`` for the bare result modes, else ``user``."""
        return observation_role(self.tool_result_mode)

    # ----- the protocol ----------------------------------------------------------------------
    def _start(self) -> list[dict[str, str]]:
        self.world = self.start()
        self.tools = self._initial_tools()
        self.offered = [tool["name"] for tool in self.tools]
        self._turns: list[list[list[str]]] = [[]]
        self.turn = self.steps_in_turn = 0
        self.terminated = self.completed = self.force_zero_reward = False
        self.terminated_reason: str | None = None
        self.events = dict.fromkeys(EVENTS, 0)
        self.turn_events = [TurnEventCounts() for _ in self.task.gt_turns]
        self.error_messages: list[str] = []
        self._version = 0
        self._checks: tuple[int, list[TurnCheck]] | None = None
        first, _ = self.turn_message(0)
        return render_initial_messages(self.prompt_mode, self.tools, first, self.interface.system_blocks())

    def _initial_tools(self) -> list[dict[str, Any]]:
        """The interface's transform of the task's tools, skipped when it reports observation hints off
        (its deep copy is then pure cost: the episode never changes a doc)."""
        active = getattr(self.interface, "active", None)
        if isinstance(active, dict) and active.get("observation_lite") is False:
            return list(self.task.tools)
        return self.interface.transform_tools(list(self.task.tools))

    def reset(self) -> list[dict[str, str]]:
        """Start (or restart) the episode; returns ``[system, first user]`` (the constructor's start is
        reused while nothing happened since)."""
        if not self._pristine:
            self._initial = self._start()
            self._pristine = True
        return [dict(m) for m in self._initial]

    def step(self, content: str) -> StepOutcome:
        """Apply one assistant message; returns the next observation."""
        if self.terminated:
            raise EpisodeTerminatedError(f"episode of {self.task.id} has terminated ({self.terminated_reason}); "
                                         "create a new one")
        if not isinstance(content, str):
            raise ValueError(f"assistant content must be a string, got {type(content).__name__}")
        self._pristine = False
        self.events["assistant_messages"] += 1
        parsed = self.parse(content)
        if parsed.errors and not parsed.calls:
            return self._reject(parsed.errors, n_calls=len(parsed.rejected), unavailable=0)
        if parsed.errors:  # non-strict: keep the good calls, still count the message's errors
            self._note_parse_error(parsed.errors)
        if not parsed.calls:
            return self._advance()
        problems, unavailable = self._call_problems(parsed.calls)
        if problems:
            return self._reject(problems, n_calls=len(parsed.calls), unavailable=unavailable)
        return self._execute(parsed.calls)

    def _call_problems(self, calls: list[ToolCall]) -> tuple[list[str], int]:
        problems: list[str] = []
        unavailable = 0
        offered = set(self.offered)
        for call in calls:
            if not call.name.isidentifier() or keyword.iskeyword(call.name):
                problems.append(f"tool name {call.name[:60]!r} is not a valid function name.")
                continue
            bad = [k for k in call.arguments if not (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k))]
            if bad:
                problems.append(f"argument name {str(bad[0])[:60]!r} of '{call.name}' is not a valid identifier.")
            if self.enforce_available_tools and call.name not in offered:
                unavailable += 1
                problems.append(f"Tool '{call.name}' is not available in the current tool list.")
        return problems, unavailable

    def _note_parse_error(self, errors: list[str]) -> None:
        self.events["parse_errors"] += 1
        self.turn_events[self.turn].parse_errors += 1
        for e in errors:
            self._remember_error(e)

    def _reject(self, errors: list[str], *, n_calls: int, unavailable: int) -> StepOutcome:
        self.events["rejected_calls"] += n_calls
        self.events["tool_calls_attempted"] += n_calls
        if unavailable:
            self.events["unavailable_tool_calls"] += unavailable
            self.turn_events[self.turn].unavailable_tools += unavailable
            for e in errors:
                self._remember_error(e)
        else:
            self._note_parse_error(errors)
        # bfcl_error_type is the release's name (its protocol, which the kit keeps).
        info: dict[str, Any] = {"bfcl_error_type": "parse_error", "rejected_calls": n_calls,
                                "unavailable_tool_calls": unavailable}
        if self.terminate_on_parse_error:
            self.force_zero_reward = True
            self._end("parse_error")
            info.update(bfcl_terminated_on_parse_error=True, bfcl_force_zero_reward=True)
            return self._outcome(CONVERSATION_COMPLETED, info)
        reason = " ".join(errors)
        feedback = self.interface.parse_error_feedback(reason, parser_mode=self.tool_call_parser,
                                                       tool_names=list(self.offered))
        return self._outcome(render_invalid_tool_call(reason, feedback), info)

    def _execute(self, calls: list[ToolCall]) -> StepOutcome:
        ran, texts, failed = self._run_calls([call_to_string(c.name, c.arguments) for c in calls])
        self._turns[self.turn].append(ran)
        self._version += 1
        self.steps_in_turn += 1
        self.events["steps"] += 1
        self.events["tool_calls_attempted"] += len(calls)
        self.events["tool_calls_accepted"] += len(calls)
        turn_events = self.turn_events[self.turn]
        turn_events.model_calls.extend(c.name for c in calls)
        hints = [self.interface.tool_error_feedback(text, tool_names=list(self.offered)) if is_error else ""
                 for text, is_error in zip(texts, failed)]
        for text, is_error in zip(texts, failed):
            if is_error:
                self._remember_error(text)
        n_errors = sum(failed)
        self.events["tool_errors"] += n_errors
        turn_events.tool_errors += n_errors
        info: dict[str, Any] = {"tool_calls": len(calls), "tool_errors": n_errors}
        if n_errors:
            info["bfcl_error_type"] = "tool_error"
        if self.steps_in_turn > self.params.max_steps_per_turn:
            self._end("max_steps_per_turn")
            info["force_terminated"] = True
            return self._outcome(CONVERSATION_COMPLETED, info)
        return self._outcome(render_tool_responses(texts, hints, self.tool_result_mode), info)

    def _run_calls(self, strings: list[str]) -> tuple[list[str], list[str], list[bool]]:
        """Run ``strings`` in order; returns (the calls that ran, one text per call, which failed).

        Results are cut to the caps as they come, so a message of thousands of calls never holds
        more than an observation's worth of text. Calls left when the step's time budget is spent
        are not run (nor replayed by the check).
        """
        p = self.params
        deadline = time.monotonic() + STEP_TIME_BUDGET_S
        ran: list[str] = []
        texts: list[str] = []
        failed: list[bool] = []
        shown = 0
        for call in strings:
            if time.monotonic() > deadline:
                texts.append(f"{ERROR_PREFIX}not run: the calls of this message used up the step's time budget "
                             f"of {STEP_TIME_BUDGET_S:g} s")
                failed.append(True)
                continue
            result = self.world.run(call)
            ran.append(call)
            failed.append(result.failed)
            if shown > p.max_observation_chars:
                texts.append("")  # the observation is over its cap already: this part is cut anyway
                continue
            texts.append(truncate(result.text, p.max_tool_result_chars, "a tool result", "max_tool_result_chars"))
            shown += len(texts[-1])
        return ran, texts, failed

    def _advance(self) -> StepOutcome:
        reason = self.stop_after_turn()
        if reason is None and self.turn + 1 >= len(self.task.gt_turns):
            self.completed, reason = True, "completed"
        if reason is not None:
            self._end(reason)
            return self._outcome(CONVERSATION_COMPLETED, {"turn_advanced": True})
        self.turn += 1
        self.steps_in_turn = 0
        self._turns.append([])
        self._version += 1
        message, extra = self.turn_message(self.turn)
        return self._outcome(message, {"turn_advanced": True, **extra})

    def _end(self, reason: str) -> None:
        self.terminated, self.terminated_reason = True, reason

    def _remember_error(self, text: str) -> None:
        text = text[:_MAX_ERROR_CHARS]
        if text not in self.error_messages and len(self.error_messages) < _MAX_ERROR_MESSAGES:
            self.error_messages.append(text)

    def _outcome(self, observation: str, info: dict[str, Any]) -> StepOutcome:
        observation = truncate(observation, self.params.max_observation_chars, "the observation",
                               "max_observation_chars")
        info.update(turn=self.turn, steps_in_turn=self.steps_in_turn, terminated_reason=self.terminated_reason,
                    observation_role=self.observation_role)
        return StepOutcome(observation, self.terminated, info)

    # ----- scoring ---------------------------------------------------------------------------
    def checks(self) -> list[TurnCheck]:
        """:meth:`check_turns` on the calls accepted so far (run again only after they change)."""
        if self._checks is None or self._checks[0] != self._version:
            self._checks = (self._version, self.check_turns())
        return self._checks[1]

    def evaluate(self, sparse: bool = True) -> float | dict[str, Any]:
        """The accuracy (``sparse``) or the evaluation dict with the episode's own fields."""
        result = build_evaluation(self.checks(), played_turns=len(self.model_turns), judge=self.judge_turn)
        if self.force_zero_reward and result["valid"]:
            result.update(valid=False, accuracy=0.0, error_type=FORCE_TERMINATED,
                          error_message="The episode was ended by a parse error (terminate_on_parse_error).")
        if sparse:
            return result["accuracy"]
        return {**result, **self.evaluation_fields(result)}

    def info(self) -> dict[str, Any]:
        """A small JSON-safe summary of where the episode stands."""
        return {"task_id": self.task.id, "category": self.task.category, "turn": self.turn,
                "num_turns": len(self.task.gt_turns), "steps_in_turn": self.steps_in_turn,
                "terminated": self.terminated, "completed": self.completed,
                "terminated_reason": self.terminated_reason, "tools": list(self.offered),
                "events": dict(self.events), "tool_prompt_mode": self.prompt_mode,
                "observation_role": self.observation_role}
