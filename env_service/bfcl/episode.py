"""One BFCL multi-turn episode: the release's protocol on safe, per-episode backends.

Protocol (``bfcl_qwen_fc`` prompt, ``xml_json`` parser by default; the Llama-3.1/ToolACE prompt
modes change only the text, the call syntax and the observations' role, see
:mod:`env_service.bfcl.prompts`):

* ``reset()`` -> ``[system, first user message]``.
* ``step(assistant_text)``:
  - a parse error (strict: all calls of the message rejected) -> ``[ERROR] Invalid tool call
    format: <reason>`` (plus recovery feedback when the interface enables it); the turn does not
    advance; with ``terminate_on_parse_error`` the episode ends with a forced zero reward;
  - calls to tools not currently offered (``enforce_available_tools``, the release's default)
    are rejected the same way;
  - otherwise every call runs on this episode's backends and the results come back as
    ``<tool_response>`` blocks (``bfcl_error_type="tool_error"`` when one failed);
  - a reply without tool calls advances to the next user turn; a miss_func hold-out turn
    reveals the held-out docs with BFCL's prompting-style message and adds them to the offered
    tools; after the last turn the observation is ``[CONVERSATION_COMPLETED]`` and the episode
    is terminated;
  - like BFCL's inference loop, a turn whose executed tool-calling steps exceed
    ``max_steps_per_turn`` (20) is force-quit and the episode stops: unless that was the last
    turn, the episode then scores ``multi_turn:force_terminated``.
* ``evaluate(sparse)`` replays the accepted calls (``model_turns``: turn -> step -> call
  strings) on fresh instances through :func:`~env_service.bfcl.checker.check_episode`.

An episode is not thread-safe: one caller drives it at a time. It shares nothing mutable with
other episodes (the task's data is read-only; backends are its own).
"""

from __future__ import annotations

import json
import keyword
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from env_service.bfcl.checker import FORCE_TERMINATED, EpisodeCheck, check_episode
from env_service.bfcl.executor import ERROR_PREFIX, Executor
from env_service.bfcl.interface_params import check_block
from env_service.bfcl.limits import (
    DEFAULT_MAX_OBSERVATION_CHARS, DEFAULT_MAX_TOOL_RESULT_CHARS, STEP_TIME_BUDGET_S, truncate,
)
from env_service.bfcl.parsers import ParseResult, ToolCall, parse_tool_calls, resolve_mode
from env_service.bfcl.prompts import (
    CONVERSATION_COMPLETED, PROMPT_MODE_PAIRS, TOOL_PROMPT_MODES, TOOL_RESULT_MODES, call_to_string,
    observation_role, render_initial_messages, render_invalid_tool_call, render_revealed_functions,
    render_tool_responses,
)
from env_service.bfcl.tasks import Task

logger = logging.getLogger(__name__)

# Keys the release's clients send that mean nothing here: accepted and ignored.
IGNORED_PARAM_KEYS: frozenset[str] = frozenset({
    "data_path", "answer_path", "model_name", "split_id_path", "split_path", "split", "env_type",
    "sparse", "max_steps", "tool_config_path",
})
_MAX_ERROR_MESSAGES = 50
_MAX_ERROR_CHARS = 300


class EpisodeTerminatedError(ValueError):
    """``step`` on an episode that has already ended (a caller error, hence a ``ValueError``)."""


class EpisodeParams(BaseModel):
    """The SEAL-compatible per-episode ``params`` (unknown keys are rejected by name)."""

    model_config = ConfigDict(extra="forbid")

    strict_tool_parser: bool = True
    # None: the parser / result mode that tool_prompt_mode pairs with (PROMPT_MODE_PAIRS).
    tool_call_parser: str | None = None
    reject_tool_call_with_content: bool = False
    flag_python_literals_in_tool_json: bool = False
    accept_parameters_as_arguments: bool = False
    terminate_on_parse_error: bool = False
    enforce_available_tools: bool = Field(True, description="reject calls to tools not currently offered "
                                          "(release default; multi_turn_miss_func_49's ground truth then cannot pass)")
    tool_prompt_mode: str = "bfcl_qwen_fc"
    tool_result_mode: str | None = None
    # The evaluation interface unless the caller asks for the training one ("sample"): a client
    # that leaves it out must never get training-time hints.
    rollout_mode: str = "validate"
    is_open_query: bool = False
    observation_lite: dict[str, Any] | None = None
    tool_feedback_evolution: dict[str, Any] | None = None
    diagnostic_evolution: dict[str, Any] | None = None
    max_steps_per_turn: int = Field(20, ge=1)
    # Output caps (not in the release, which answered a 0.9 MB message with 360 MB); the defaults sit
    # above the largest result and observation of the 800 tasks' ground truth.
    max_tool_result_chars: int = Field(DEFAULT_MAX_TOOL_RESULT_CHARS, ge=256, le=16_777_216,
                                       description="longer tool results are cut, with a marker")
    max_observation_chars: int = Field(DEFAULT_MAX_OBSERVATION_CHARS, ge=1024, le=67_108_864,
                                       description="longer observations are cut, with a marker")

    @model_validator(mode="before")
    @classmethod
    def _drop_release_only_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ignored = sorted(k for k in data if k in IGNORED_PARAM_KEYS)
        if ignored:
            logger.debug("ignoring release-only episode params: %s", ", ".join(ignored))
        unknown = sorted(k for k in data if k not in IGNORED_PARAM_KEYS and k not in cls.model_fields)
        if unknown:
            raise ValueError(f"unknown episode params key(s): {', '.join(unknown)}; "
                             f"known keys: {', '.join(sorted(cls.model_fields))}")
        return {k: v for k, v in data.items() if k not in IGNORED_PARAM_KEYS}

    @field_validator("tool_call_parser")
    @classmethod
    def _parser(cls, v: str | None) -> str | None:
        return None if v is None else resolve_mode(v)

    @field_validator("tool_prompt_mode")
    @classmethod
    def _prompt_mode(cls, v: str) -> str:
        if v not in TOOL_PROMPT_MODES:
            raise ValueError(f"tool_prompt_mode {v!r} is not supported; use one of {', '.join(TOOL_PROMPT_MODES)}")
        return v

    @field_validator("observation_lite", "tool_feedback_evolution", "diagnostic_evolution", mode="before")
    @classmethod
    def _interface_block(cls, v: Any, info: ValidationInfo) -> dict[str, Any] | None:
        return check_block(info.field_name, v)

    @field_validator("tool_result_mode")
    @classmethod
    def _result_mode(cls, v: str | None) -> str | None:
        if v is not None and v not in TOOL_RESULT_MODES:
            raise ValueError(f"tool_result_mode {v!r} is not supported; use one of {', '.join(TOOL_RESULT_MODES)}")
        return v

    @model_validator(mode="after")
    def _pair_with_prompt_mode(self) -> "EpisodeParams":
        parser, result_mode = PROMPT_MODE_PAIRS[self.tool_prompt_mode]
        if self.tool_call_parser is None:
            self.tool_call_parser = resolve_mode(parser)
        if self.tool_result_mode is None:
            self.tool_result_mode = result_mode
        return self

    @property
    def observation_role(self) -> str:
        """The chat role of this episode's observations (``ipython`` or ``user``)."""
        return observation_role(self.tool_result_mode)


class Interface(Protocol):
    """The part of ``seal_shared.interface.EpisodeInterface`` the episode uses."""

    def transform_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def system_blocks(self) -> list[str]: ...
    def parse_error_feedback(self, reason: str, *, parser_mode: str, tool_names: list[str]) -> str: ...
    def tool_error_feedback(self, error_text: str, *, tool_names: list[str]) -> str: ...


def make_interface(params: EpisodeParams, category: str) -> Interface:
    """The SEAL interface layer for this episode (``seal_shared.interface.EpisodeInterface``)."""
    from seal_shared.interface import EpisodeInterface  # deferred: the environment core works without it in tests

    return EpisodeInterface.from_params(params.model_dump(), category=category)


@dataclass
class StepOutcome:
    observation: str
    terminated: bool
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0  # BFCL accuracy once terminated (0 before), as the release's /step


@dataclass
class TurnEventCounts:
    """Per-GT-turn events, reported as the evaluate result's ``turn_events`` (docs/paper_map.md
    maps them, with the tags, to the paper's labels)."""

    parse_errors: int = 0
    unavailable_tools: int = 0
    tool_errors: int = 0
    model_calls: list[str] = field(default_factory=list)


def is_tool_error(result: str) -> bool:
    """BFCL backends report failures as ``{"error": ...}`` dicts; the executor as ``Error during execution``."""
    if result.startswith(ERROR_PREFIX):
        return True
    if result.startswith("{") and '"error"' in result:
        try:
            value = json.loads(result)
        except json.JSONDecodeError:
            return False
        return isinstance(value, dict) and "error" in value
    return False


class BfclEpisode:
    """One rollout of one task (see the module docstring for the protocol)."""

    def __init__(self, task: Task, params: EpisodeParams | dict[str, Any] | None = None,
                 *, interface: Interface | None = None):
        self.task = task
        self.params = params if isinstance(params, EpisodeParams) else EpisodeParams.model_validate(params or {})
        self.interface = interface if interface is not None else make_interface(self.params, task.category)
        self._mode = self.params.tool_call_parser
        self._initial_messages = self._start()
        self._pristine = True

    # ----- lifecycle -------------------------------------------------------------------------
    def reset(self) -> list[dict[str, str]]:
        """Start (or restart) the episode: fresh backends; returns ``[system, first user]``.

        The constructor already starts the episode; a ``reset()`` before the first ``step`` just
        returns those messages instead of building the backends twice.
        """
        if not self._pristine:
            self._initial_messages = self._start()
            self._pristine = True
        return [dict(m) for m in self._initial_messages]

    def _start(self) -> list[dict[str, str]]:
        t = self.task
        self._executor = Executor(t.involved_classes, t.entry["initial_config"], t.long_context)
        self.tools = self._initial_tools()
        self.offered = [tool["name"] for tool in self.tools]
        self.model_turns: list[list[list[str]]] = [[]]
        self.turn = 0
        self.steps_in_turn = 0
        self.terminated = False
        self.completed = False
        self.terminated_reason: str | None = None
        self.force_zero_reward = False
        self.events: dict[str, int] = dict.fromkeys(
            ("parse_errors", "rejected_calls", "unavailable_tool_calls", "tool_errors",
             "tool_calls_attempted", "tool_calls_accepted", "steps", "assistant_messages"), 0)
        self.turn_events = [TurnEventCounts() for _ in t.gt_turns]
        self.error_messages: list[str] = []
        self._check_cache: tuple[int, EpisodeCheck] | None = None
        self._version = 0
        first = t.user_message(0)
        if first is None and 0 in t.held_out:
            first = self._reveal(0)
        return render_initial_messages(self.params.tool_prompt_mode, self.tools, first or "",
                                       self.interface.system_blocks())

    def step(self, content: str) -> StepOutcome:
        """Apply one assistant message; returns the next observation."""
        if self.terminated:
            raise EpisodeTerminatedError(f"episode of {self.task.id} has terminated ({self.terminated_reason}); "
                                         "create a new one")
        if not isinstance(content, str):
            raise ValueError(f"assistant content must be a string, got {type(content).__name__}")
        self._pristine = False
        self.events["assistant_messages"] += 1
        p = self.params
        parsed = parse_tool_calls(content, self._mode, strict=p.strict_tool_parser,
                                  reject_tool_call_with_content=p.reject_tool_call_with_content,
                                  flag_python_literals_in_tool_json=p.flag_python_literals_in_tool_json,
                                  accept_parameters_as_arguments=p.accept_parameters_as_arguments)
        if parsed.errors and not parsed.calls:
            return self._reject(parsed.errors, n_calls=len(parsed.rejected), unavailable=0)
        if parsed.errors:  # non-strict: keep the good calls, still count the message's errors
            self._note_parse_error(parsed.errors)
        if not parsed.calls:
            return self._advance()
        problems, unavailable = self._validate_calls(parsed)
        if problems:
            return self._reject(problems, n_calls=len(parsed.calls), unavailable=unavailable)
        return self._execute(parsed.calls)

    def _initial_tools(self) -> list[dict[str, Any]]:
        """The offered tools at turn 0: the interface's transform, skipped when it reports that
        observation hints are off (its deep copy of ~30 docs is then pure cost; the episode never
        changes a doc, so the store's read-only dicts can be offered as they are)."""
        active = getattr(self.interface, "active", None)
        if isinstance(active, dict) and active.get("observation_lite") is False:
            return list(self.task.tools)
        return self.interface.transform_tools(self.task.tools)

    @property
    def executor(self) -> Executor:
        """This episode's live backends (read them; driving them directly bypasses the record)."""
        return self._executor

    # ----- step parts ------------------------------------------------------------------------
    def _validate_calls(self, parsed: ParseResult) -> tuple[list[str], int]:
        problems: list[str] = []
        unavailable = 0
        offered = set(self.offered)
        for call in parsed.calls:
            if not call.name.isidentifier() or keyword.iskeyword(call.name):
                problems.append(f"tool name {call.name[:60]!r} is not a valid function name.")
                continue
            bad = [k for k in call.arguments if not (isinstance(k, str) and k.isidentifier()
                                                     and not keyword.iskeyword(k))]
            if bad:
                problems.append(f"argument name {str(bad[0])[:60]!r} of '{call.name}' is not a valid identifier.")
            if self.params.enforce_available_tools and call.name not in offered:
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
        info: dict[str, Any] = {"bfcl_error_type": "parse_error", "rejected_calls": n_calls,
                                "unavailable_tool_calls": unavailable}
        if self.params.terminate_on_parse_error:
            self.force_zero_reward = True
            self._terminate("parse_error")
            info.update(bfcl_terminated_on_parse_error=True, bfcl_force_zero_reward=True)
            return self._outcome(CONVERSATION_COMPLETED, info)
        reason = " ".join(errors)
        feedback = self.interface.parse_error_feedback(reason, parser_mode=self._mode, tool_names=list(self.offered))
        return self._outcome(render_invalid_tool_call(reason, feedback), info)

    def _execute(self, calls: list[ToolCall]) -> StepOutcome:
        ran, texts, failed = self._run_calls([call_to_string(c.name, c.arguments) for c in calls])
        self.model_turns[self.turn].append(ran)
        self._version += 1
        self.steps_in_turn += 1
        self.events["steps"] += 1
        self.events["tool_calls_attempted"] += len(calls)
        self.events["tool_calls_accepted"] += len(calls)
        ev = self.turn_events[self.turn]
        ev.model_calls.extend(c.name for c in calls)
        hints: list[str] = []
        n_errors = 0
        for text, is_error in zip(texts, failed):
            if is_error:
                n_errors += 1
                self._remember_error(text)
                hints.append(self.interface.tool_error_feedback(text, tool_names=list(self.offered)))
            else:
                hints.append("")
        self.events["tool_errors"] += n_errors
        ev.tool_errors += n_errors
        info: dict[str, Any] = {"tool_calls": len(calls), "tool_errors": n_errors}
        if n_errors:
            info["bfcl_error_type"] = "tool_error"
        if self.steps_in_turn > self.params.max_steps_per_turn:
            self._terminate("max_steps_per_turn")
            info["force_terminated"] = True
            return self._outcome(CONVERSATION_COMPLETED, info)
        return self._outcome(render_tool_responses(texts, hints, self.params.tool_result_mode), info)

    def _run_calls(self, strings: list[str]) -> tuple[list[str], list[str], list[bool]]:
        """Run ``strings`` in order; returns (the calls that ran, one text per call, which failed).

        Results are cut to the caps as they come, so a message of thousands of calls never holds
        more than an observation's worth of text; errors are recognised on the whole result. Calls
        left when the step's time budget is spent are not run (nor replayed by the checker).
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
            result = self._executor.run_one(call)
            ran.append(call)
            failed.append(is_tool_error(result.text))
            if shown > p.max_observation_chars:
                texts.append("")  # the observation is over its cap already: this part is cut anyway
                continue
            texts.append(truncate(result.text, p.max_tool_result_chars, "a tool result", "max_tool_result_chars"))
            shown += len(texts[-1])
        return ran, texts, failed

    def _advance(self) -> StepOutcome:
        nxt = self.turn + 1
        if self.params.is_open_query:
            self._terminate("open_query")
            return self._outcome(CONVERSATION_COMPLETED, {"turn_advanced": True})
        if nxt >= len(self.task.gt_turns):
            self.completed = True
            self._terminate("completed")
            return self._outcome(CONVERSATION_COMPLETED, {"turn_advanced": True})
        self.turn = nxt
        self.steps_in_turn = 0
        self.model_turns.append([])
        self._version += 1
        if nxt in self.task.held_out:
            return self._outcome(self._reveal(nxt), {"turn_advanced": True, "revealed_tools": True})
        return self._outcome(self.task.user_message(nxt) or "", {"turn_advanced": True})

    def _reveal(self, turn: int) -> str:
        docs = self.task.held_out[turn]
        # The revealed docs are offered as they are: the interface annotates only the initial tools.
        self.tools = self.tools + [dict(d) for d in docs]
        self.offered = self.offered + [d["name"] for d in docs]
        return render_revealed_functions(list(docs))

    def _terminate(self, reason: str) -> None:
        self.terminated = True
        self.terminated_reason = reason

    def _remember_error(self, text: str) -> None:
        text = text[:_MAX_ERROR_CHARS]
        if text not in self.error_messages and len(self.error_messages) < _MAX_ERROR_MESSAGES:
            self.error_messages.append(text)

    def _outcome(self, observation: str, info: dict[str, Any]) -> StepOutcome:
        observation = truncate(observation, self.params.max_observation_chars, "the observation",
                               "max_observation_chars")
        info.update(turn=self.turn, steps_in_turn=self.steps_in_turn, terminated_reason=self.terminated_reason,
                    observation_role=self.params.observation_role)
        reward = self.evaluate(sparse=True) if self.terminated else 0.0
        return StepOutcome(observation=observation, terminated=self.terminated, info=info, reward=reward)

    # ----- scoring ---------------------------------------------------------------------------
    def check(self) -> EpisodeCheck:
        """The checker's verdict on the calls accepted so far (cached until the next step)."""
        if self._check_cache is None or self._check_cache[0] != self._version:
            result = check_episode(self.model_turns, self.task.gt_turns, self.task.entry)
            self._check_cache = (self._version, result)
        return self._check_cache[1]

    def evaluate(self, sparse: bool = True) -> float | dict[str, Any]:
        """BFCL accuracy (``sparse``) or the full result dict with tags, progress and events."""
        check = self.check()
        valid = check.valid and not self.force_zero_reward
        if sparse:
            return 1.0 if valid else 0.0
        result = check.to_dict()
        if self.force_zero_reward and check.valid:
            result.update(error_type=FORCE_TERMINATED,
                          error_message="The episode was ended by a parse error (terminate_on_parse_error).")
        result.update(valid=valid, accuracy=1.0 if valid else 0.0)
        result.update(self._episode_fields(result))
        return result

    def _episode_fields(self, check: dict[str, Any]) -> dict[str, Any]:
        progress_keys = ("per_turn_valid", "irrelevance_per_turn", "passed_turns", "scorable_turns",
                         "passed_irrelevance_turns", "irrelevance_turns", "terminated_early")
        return {
            "task_id": self.task.id,
            "test_id": self.task.id,
            "category": self.task.category,
            "turn_count": self.turn + 1,
            "num_turns": len(self.task.gt_turns),
            "completed": self.completed,
            "terminated_reason": self.terminated_reason,
            "force_zero_reward": self.force_zero_reward,
            "events": dict(self.events),
            "turn_events": [{"parse_errors": e.parse_errors, "unavailable_tools": e.unavailable_tools,
                             "tool_errors": e.tool_errors, "model_calls": list(e.model_calls),
                             "gt_calls": [c.split("(", 1)[0].strip() for c in gt]}
                            for e, gt in zip(self.turn_events, self.task.gt_turns)],
            "error_messages": list(self.error_messages),
            "model_turns": [[list(step) for step in turn] for turn in self.model_turns],
            # The release's names for the same figures, for clients written against it.
            "bfcl_progress": check["progress"],
            "bfcl_progress_with_irrelevance": check["progress_with_irrelevance"],
            "bfcl_progress_info": {**{k: check[k] for k in progress_keys}, "failure_tags": check["failure_tags"]},
        }

    def info(self) -> dict[str, Any]:
        """A small JSON-safe summary of where the episode stands."""
        return {"task_id": self.task.id, "category": self.task.category, "turn": self.turn,
                "num_turns": len(self.task.gt_turns), "steps_in_turn": self.steps_in_turn,
                "terminated": self.terminated, "completed": self.completed,
                "terminated_reason": self.terminated_reason, "tools": list(self.offered),
                "events": dict(self.events), "tool_prompt_mode": self.params.tool_prompt_mode,
                "observation_role": self.params.observation_role}
