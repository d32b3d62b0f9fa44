"""The environment kit: build a multi-turn function-calling environment from its tools, its tasks,
its per-turn check and one registration (the contract: ``docs/extending.md``).

* Tools (:mod:`~env_service.kit.tools`): plain Python classes; :func:`tool_docs` turns their
  public methods into the JSON docs the prompt shows, :class:`ToolBox` runs call strings on their
  instances safely (literal arguments, type-checked) and answers :class:`ToolResult` (with the
  declared tool-error rule: by default a returned ``{"error": ...}`` object).
* Tasks (:mod:`~env_service.kit.tasks`): :class:`Task` (user message and ground-truth call
  strings per turn, tool docs, split, category), :class:`TaskStore` and
  :func:`ground_truth_replies` (the assistant messages that play a task's ground truth).
* The episode (:mod:`~env_service.kit.episode`): :class:`ToolEpisode` owns the protocol loop
  (parsing, turn advance, step limit, the interface-evolution hooks, tool-error hints); an
  environment gives ``start()`` (a fresh world) and, when the default replay does not fit,
  ``check_turns()`` or ``parse()``. Its params: :class:`EpisodeParams` or :class:`InterfaceParams`.
* The evaluation (:mod:`~env_service.kit.evaluation`): :class:`TurnCheck` per ground-truth turn
  (a :class:`seal_shared.tags.TurnEvidence` and the refused calls' texts), :func:`replay_turns` (the
  default per-turn check), :func:`turn_failure` (the default verdict rule) and
  :func:`build_evaluation` (the evaluation dict the trainer reads, tags from :mod:`seal_shared.tags`).
* The registration (:mod:`~env_service.kit.environment`): :func:`register_tool_environment`.
"""

from env_service.bfcl.parsers import ParseResult, ToolCall
from env_service.kit.environment import episode_host, register_tool_environment
from env_service.kit.episode import EpisodeParams, InterfaceParams, StepOutcome, ToolEpisode
from env_service.kit.evaluation import (
    EMPTY_TURN, FORCE_TERMINATED, RESPONSE_MISMATCH, STATE_MISMATCH, TurnCheck, World, build_evaluation,
    replay_turns, turn_failure,
)
from env_service.kit.tasks import SPLITS, Task, TaskStore, ground_truth_replies
from env_service.kit.tools import ToolBox, ToolResult, public_methods, returns_error_key, tool_doc, tool_docs

__all__ = [
    "EMPTY_TURN",
    "FORCE_TERMINATED",
    "RESPONSE_MISMATCH",
    "SPLITS",
    "STATE_MISMATCH",
    "EpisodeParams",
    "InterfaceParams",
    "ParseResult",
    "StepOutcome",
    "Task",
    "TaskStore",
    "ToolBox",
    "ToolCall",
    "ToolEpisode",
    "ToolResult",
    "TurnCheck",
    "World",
    "build_evaluation",
    "episode_host",
    "ground_truth_replies",
    "public_methods",
    "register_tool_environment",
    "replay_turns",
    "returns_error_key",
    "tool_doc",
    "tool_docs",
    "turn_failure",
]
