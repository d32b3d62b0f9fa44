"""The environment kit: build a multi-turn function-calling environment from its world, its tasks,
its per-turn check and one registration (the contract, with a worked example: ``docs/extending.md``).
BFCL and ``notes`` are built on it.

Modules: :mod:`~env_service.kit.tools` (tool classes as JSON docs and a safe executor, the
:class:`ToolBox`), :mod:`seal_shared.calls` (call strings), :mod:`~env_service.kit.tasks`,
:mod:`~env_service.kit.episode` (the protocol loop, :class:`ToolEpisode`), :mod:`~env_service.kit.params`,
:mod:`~env_service.kit.prompts`, :mod:`~env_service.kit.parsers`, :mod:`~env_service.kit.evaluation`
(per-turn checks to the evaluation dict the trainer reads) and :mod:`~env_service.kit.environment`
(:func:`register_tool_environment`).
"""

from seal_shared.calls import ERROR_PREFIX, CallParseError, ParsedCall, call_to_string, parse_call
from env_service.kit.environment import episode_host, register_tool_environment
from env_service.kit.episode import EpisodeTerminatedError, StepOutcome, ToolEpisode
from env_service.kit.evaluation import (
    EMPTY_TURN, FORCE_TERMINATED, RESPONSE_MISMATCH, STATE_MISMATCH, StatefulWorld, TurnCheck, TurnVerdict, World,
    build_evaluation, replay_turns, turn_failure,
)
from env_service.kit.params import EpisodeParams, InterfaceParams
from env_service.kit.parsers import ParseResult, ToolCall, parse_tool_calls
from env_service.kit.tasks import SPLITS, Task, TaskStore, ground_truth_replies
from env_service.kit.tools import ToolBox, ToolResult, public_methods, returns_error_key, tool_doc, tool_docs

__all__ = ["EMPTY_TURN", "ERROR_PREFIX", "FORCE_TERMINATED", "RESPONSE_MISMATCH", "SPLITS", "STATE_MISMATCH",
           "CallParseError", "EpisodeParams", "EpisodeTerminatedError", "InterfaceParams", "ParseResult", "ParsedCall",
           "StatefulWorld", "StepOutcome", "Task", "TaskStore", "ToolBox", "ToolCall", "ToolEpisode", "ToolResult",
           "TurnCheck", "TurnVerdict", "World", "build_evaluation", "call_to_string", "episode_host",
           "ground_truth_replies", "parse_call", "parse_tool_calls", "public_methods", "register_tool_environment",
           "replay_turns", "returns_error_key", "tool_doc", "tool_docs", "turn_failure"]
