"""One BFCL multi-turn episode: the kit's protocol (:class:`env_service.kit.ToolEpisode`) on BFCL's backends.

BFCL supplies, of the kit's hooks,

* its world (:class:`BfclWorld`): the task's backends behind the safe executor
  (:mod:`env_service.bfcl.executor`), whose tool errors are BFCL's: a backend's ``{"error": ...}``
  object, or the executor's ``Error during execution`` (:func:`is_tool_error`);
* its parsing: the parser, prompt and result modes of its params (the release's three prompt modes,
  :mod:`env_service.kit.prompts`) and the strict flags (:class:`BfclParams`);
* its per-turn check: BFCL's checker (:func:`env_service.bfcl.checker.check_turns`), whose verdict on
  each turn is the episode's (:meth:`BfclEpisode.judge_turn`);
* the held-out tool reveal: a miss_func hold-out turn reveals the held-out docs with BFCL's
  prompting-style message and adds them to the offered tools (the interface annotates only the
  initial tools); and open queries: with ``is_open_query`` the episode ends after its first turn.

The rest is the kit's loop: refused messages, calls to tools not offered (``enforce_available_tools``,
the release's default), the caps, the turn advance and, as in BFCL's inference loop, a turn whose
executed tool-calling steps exceed ``max_steps_per_turn`` (20) is force-quit and the episode stops:
unless that was the last turn, it then scores ``multi_turn:force_terminated``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from env_service.bfcl.checker import check_turns, judge
from env_service.bfcl.executor import ERROR_PREFIX, MULTI_TURN_CLASSES, REFUSED_KINDS, Executor, backend_class
from env_service.bfcl.tasks import BfclTask
from env_service.kit import InterfaceParams, ParseResult, ToolEpisode, ToolResult, TurnCheck
from env_service.kit.parsers import parse_tool_calls, resolve_mode
from env_service.kit.prompts import PROMPT_MODE_PAIRS, TOOL_PROMPT_MODES, TOOL_RESULT_MODES, observation_role

logger = logging.getLogger(__name__)

# Keys the release's clients send that mean nothing here: accepted and ignored.
IGNORED_PARAM_KEYS: frozenset[str] = frozenset({
    "data_path", "answer_path", "model_name", "split_id_path", "split_path", "split", "env_type",
    "sparse", "max_steps", "tool_config_path",
})
# BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC (constants/default_prompts.py).
MISS_FUNC_SENTENCE = "I have updated some more functions you can choose from. What about now?"


class BfclParams(InterfaceParams):
    """The SEAL-compatible per-episode ``params`` (the kit's, plus BFCL's; unknown keys are rejected by name)."""

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
    is_open_query: bool = False
    max_steps_per_turn: int = Field(20, ge=1)

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

    @field_validator("tool_prompt_mode", "tool_result_mode")
    @classmethod
    def _supported_mode(cls, v: str | None, info: ValidationInfo) -> str | None:
        supported = TOOL_PROMPT_MODES if info.field_name == "tool_prompt_mode" else TOOL_RESULT_MODES
        if v is not None and v not in supported:
            raise ValueError(f"{info.field_name} {v!r} is not supported; use one of {', '.join(supported)}")
        return v

    @model_validator(mode="after")
    def _pair_with_prompt_mode(self) -> BfclParams:
        parser, result_mode = PROMPT_MODE_PAIRS[self.tool_prompt_mode]
        if self.tool_call_parser is None:
            self.tool_call_parser = resolve_mode(parser)
        if self.tool_result_mode is None:
            self.tool_result_mode = result_mode
        return self

    @property
    def observation_role(self) -> str:
        """The chat role of this episode's observations (``ipython`` or ``user``)."""
        return observation_role(str(self.tool_result_mode))


def is_tool_error(result: str) -> bool:
    """BFCL's tool-error rule: backends report failures as ``{"error": ...}`` objects, the executor as
    ``Error during execution``."""
    if result.startswith(ERROR_PREFIX):
        return True
    if result.startswith("{") and '"error"' in result:
        try:
            value = json.loads(result)
        except json.JSONDecodeError:
            return False
        return isinstance(value, dict) and "error" in value
    return False


def render_revealed_functions(docs: list[dict[str, Any]]) -> str:
    """BFCL's prompting-style hold-out turn: the docs' Python ``str()``, a newline, the sentence."""
    return str(docs) + "\n" + MISS_FUNC_SENTENCE


@functools.cache
def _backend_parameters() -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for class_name in MULTI_TURN_CLASSES:
        for name, fn in inspect.getmembers(backend_class(class_name), predicate=inspect.isfunction):
            if not name.startswith("_"):
                table[name] = tuple(p for p in inspect.signature(fn).parameters if p != "self")
    return table


class BfclWorld:
    """A task's BFCL backends as the kit's world: its own executor runs the calls, BFCL's rule names the
    tool errors, and a call the executor refused before any backend method ran is marked so."""

    def __init__(self, task: BfclTask) -> None:
        self.executor = Executor(task.involved_classes, task.entry["initial_config"], task.long_context)

    def run(self, call: str) -> ToolResult:
        result = self.executor.run_one(call)
        refused = result.error if result.error in REFUSED_KINDS else None
        return ToolResult(result.text, refused, tool_error=is_tool_error(result.text))


class BfclEpisode(ToolEpisode):
    """One rollout of one BFCL task (see the module docstring)."""

    task: BfclTask
    params: BfclParams
    params_model = BfclParams

    # The protocol's choices are the episode's params (the kit fixes them per environment).
    tool_call_parser = property(lambda self: str(self.params.tool_call_parser))  # type: ignore[assignment]
    prompt_mode = property(lambda self: self.params.tool_prompt_mode)  # type: ignore[assignment]
    tool_result_mode = property(lambda self: str(self.params.tool_result_mode))  # type: ignore[assignment]
    enforce_available_tools = property(lambda self: self.params.enforce_available_tools)  # type: ignore[assignment]
    terminate_on_parse_error = property(lambda self: self.params.terminate_on_parse_error)  # type: ignore[assignment]

    @property
    def executor(self) -> Executor:
        """This episode's live backends (read them; driving them directly bypasses the record)."""
        return self.world.executor

    def start(self) -> BfclWorld:
        return BfclWorld(self.task)

    @classmethod
    def tool_parameters(cls, tasks: Any = ()) -> dict[str, list[str]]:
        """Each method's parameter names in order, from the 8 backend classes' signatures (the docs'
        property order need not be the signature's), whatever ``tasks``. Method names do not
        collide across them."""
        return {name: list(params) for name, params in _backend_parameters().items()}

    def parse(self, content: str) -> ParseResult:
        p = self.params
        return parse_tool_calls(content, self.tool_call_parser, strict=p.strict_tool_parser,
                                reject_tool_call_with_content=p.reject_tool_call_with_content,
                                flag_python_literals_in_tool_json=p.flag_python_literals_in_tool_json,
                                accept_parameters_as_arguments=p.accept_parameters_as_arguments)

    def check_turns(self) -> list[TurnCheck]:
        return list(check_turns(self.model_turns, self.task.gt_turns, self.task.entry))

    judge_turn = staticmethod(judge)  # BFCL's checker judged each turn itself (BfclTurnCheck.verdict)

    def turn_message(self, turn: int) -> tuple[str, dict[str, Any]]:
        text = self.task.user_message(turn)
        if turn in self.task.held_out and (turn > 0 or text is None):
            return self._reveal(turn), {"revealed_tools": True}
        return text or "", {}

    def _reveal(self, turn: int) -> str:
        docs = self.task.held_out[turn]
        self.tools = self.tools + [dict(d) for d in docs]
        self.offered = self.offered + [d["name"] for d in docs]
        return render_revealed_functions(list(docs))

    def stop_after_turn(self) -> str | None:
        return "open_query" if self.params.is_open_query else None

    def evaluation_fields(self, result: dict[str, Any]) -> dict[str, Any]:
        """The kit's fields plus the release's names for the progress figures, for clients written against it."""
        progress_keys = ("per_turn_valid", "irrelevance_per_turn", "passed_turns", "scorable_turns",
                         "passed_irrelevance_turns", "irrelevance_turns", "terminated_early")
        return {**super().evaluation_fields(result), "bfcl_progress": result["progress"],
                "bfcl_progress_with_irrelevance": result["progress_with_irrelevance"],
                "bfcl_progress_info": {**{k: result[k] for k in progress_keys}, "failure_tags": result["failure_tags"]}}
