"""Request and response models of the environment service (the two route families, the statuses and
the nesting limit: :mod:`env_service.app`).

The release-compatible routes take one :class:`ServiceRequest` and answer an :class:`Envelope`; each
typed ``/v1/...`` route has its own request/response pair (responses carry ``protocol_version``).
Refusing bodies nested past :data:`MAX_NESTING` keeps deep values away from the worker pipe's pickling
and the episodes (legitimate bodies nest fewer than 10 levels).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from env_service.kit.tasks import SPLITS

PROTOCOL_VERSION = "1"
MAX_NESTING = 64  # deepest a request body's objects and lists may nest (the body is level 1)


def nesting_exceeds(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value``'s dicts and lists nest deeper than ``limit`` levels (``value`` is level 1).

    Iterative (a deep value cannot exhaust the stack here) and it looks at containers only, so a
    long string costs nothing; it stops at the first container past the limit.
    """
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False

_ID = Field(min_length=1, max_length=200, description="Instance id; any printable string without whitespace.")


class _Strict(BaseModel):
    """Typed requests reject unknown keys, so a misspelt field fails loudly instead of being ignored."""

    model_config = ConfigDict(extra="forbid")


class ServiceRequest(BaseModel):
    """The release's single request body. Unknown top-level keys are ignored, as the release did."""

    # The environment's name; checked on /create against the served one (None: the served one).
    env_type: str | None = None
    task_id: str | None = None
    instance_id: str | None = None
    messages: dict[str, Any] | list[Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)


class Envelope(BaseModel):
    """``{"success": true, "data": ...}``: the release's answer shape for every POST route."""

    success: bool = True
    data: Any = None


class ErrorBody(BaseModel):
    code: str = Field(description="bad_request | not_found | conflict | too_large | unavailable | internal")
    message: str


class ErrorResponse(BaseModel):
    """Every error answer, on both route families. ``detail`` repeats ``error.message`` (FastAPI style)."""

    success: Literal[False] = False
    detail: str
    error: ErrorBody
    protocol_version: str = PROTOCOL_VERSION


class _Versioned(BaseModel):
    protocol_version: str = PROTOCOL_VERSION


class Message(BaseModel):
    """A chat message. Observations always carry ``tool_calls: []`` (the release's shape)."""

    role: str
    content: str
    tool_calls: list[Any] | None = None


class HealthResponse(_Versioned):
    status: Literal["ok", "degraded"]
    workers: int
    workers_alive: int


class CreateRequest(_Strict):
    task_id: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict, description="Episode params (EpisodeParams keys).")
    instance_id: str | None = Field(default=None, min_length=1, max_length=200)


class CreateResponse(_Versioned):
    instance_id: str
    messages: list[Message] = Field(description="[system, user]")
    info: dict[str, Any]


class StepRequest(_Strict):
    instance_id: str = _ID
    content: str = Field(description="The assistant message text.")


class StepResponse(_Versioned):
    observation: Message
    terminated: bool
    reward: float = Field(description="The sparse score when terminated, else 0.")
    info: dict[str, Any]


class EvaluateRequest(_Strict):
    instance_id: str = _ID
    sparse: bool = False


class EvaluateResponse(_Versioned):
    score: float = Field(description="BFCL accuracy of the episode so far (1.0 or 0.0).")
    result: dict[str, Any] | None = Field(default=None, description="The full result (only when not sparse).")


class InstanceRequest(_Strict):
    instance_id: str = _ID


class ReleaseResponse(_Versioned):
    released: bool = Field(description="False when the id was not live (already released or reaped).")


class InfoResponse(_Versioned):
    info: Any


class ProfileRequest(_Strict):
    split: Literal["train", "val", "test", "eval"] = "train"


class ProfileResponse(_Versioned):
    split: str
    task_ids: list[str]


class CatalogueRequest(_Strict):
    """No fields: the catalogue is the served environment's."""


class CatalogueResponse(_Versioned):
    """What a trainer reads of the served environment before and between episodes: its name, the
    interface-evolution blocks it honours, its ``train`` and ``val`` splits (the held-out ``test`` and
    ``eval`` are read by a final evaluation only), every task's category and each tool's parameter
    names in order (to name the positional arguments of a call string)."""

    env: str
    description: str = ""
    example_task_id: str = ""
    interface_blocks: list[str] = Field(default_factory=list)
    splits: dict[str, list[str]] = Field(default_factory=dict)
    categories: dict[str, str] = Field(default_factory=dict)
    tool_parameters: dict[str, list[str]] = Field(default_factory=dict)


class ParamsCheckRequest(_Strict):
    params: dict[str, Any] = Field(default_factory=dict)


class ParamsCheckResponse(_Versioned):
    """``problem``: why the environment refuses the params block, in one line; ``None``: accepted."""

    problem: str | None = None


class OracleRequest(_Strict):
    task_id: str
    tool_call_parser: str = "xml_json"


class OracleResponse(_Versioned):
    """A task's ground truth as call strings per turn, and the assistant messages that play it."""

    task_id: str
    gt_turns: list[list[str]]
    messages: list[str]


class JudgeRequest(_Strict):
    task_id: str
    model_turns: list[list[list[str]]]  # turn -> step -> call strings


class RouteLatency(BaseModel):
    count: int
    p50_ms: float
    p99_ms: float


class MetricsResponse(_Versioned):
    uptime_s: float
    workers: int
    workers_alive: int
    worker_restarts: int
    instances_live: int
    instances_per_worker: list[int]
    created_total: int
    released_total: int
    reaped_total: int
    lost_total: int
    steps_total: int
    rejected_over_cap_total: int
    errors_total: dict[str, int]
    latency: dict[str, RouteLatency] = Field(description="Per route, over the last 4096 requests.")
