"""The environment kit: build a multi-turn function-calling environment from its world, its tasks,
its per-turn check and one registration (the contract: ``docs/extending.md``). BFCL and ``notes``
are built on it.

* The world: :class:`ToolBox` runs call strings on plain Python tool classes (:func:`tool_docs` turns
  their public methods into the JSON docs the prompt shows) and answers :class:`ToolResult`, with the
  declared tool-error rule (by default a returned ``{"error": ...}`` object); a world that brings its
  own executor implements :class:`World` (``run(call) -> ToolResult``) and declares its tool errors
  in the results. Call strings (:mod:`~env_service.kit.calls`): :func:`parse_call` (literal arguments
  only, never ``eval``) and :func:`call_to_string`.
* Tasks (:mod:`~env_service.kit.tasks`): :class:`Task` (user message and ground-truth call strings
  per turn, tool docs, split, category; subclass it for fields of your own), :class:`TaskStore` and
  :func:`ground_truth_replies` (the assistant messages that play a task's ground truth).
* The episode (:mod:`~env_service.kit.episode`): :class:`ToolEpisode` owns the protocol loop (parsing,
  turn advance, step limit, output caps, the interface-evolution hooks, tool-error hints); an
  environment gives ``start()`` (a fresh world) and, where the defaults do not fit, ``parse()``,
  ``check_turns()``, ``judge_turn()`` (the verdict), ``turn_message()`` and ``stop_after_turn()``. Its
  params: :class:`EpisodeParams` or :class:`InterfaceParams` (:mod:`~env_service.kit.params`).
  Prompt and observation text: :mod:`~env_service.kit.prompts`; tool-call parsers:
  :mod:`~env_service.kit.parsers`.
* The evaluation (:mod:`~env_service.kit.evaluation`): :class:`TurnCheck` per ground-truth turn
  (a :class:`seal_shared.tags.TurnEvidence` and the refused calls' texts), :func:`replay_turns` (the
  default per-turn check), :func:`turn_failure` (the default verdict rule, a :class:`TurnVerdict`)
  and :func:`build_evaluation` (the evaluation dict the trainer reads, tags from :mod:`seal_shared.tags`).
* The registration (:mod:`~env_service.kit.environment`): :func:`register_tool_environment`.
"""

from env_service.kit.calls import ERROR_PREFIX, CallParseError, ParsedCall, call_to_string, parse_call
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
