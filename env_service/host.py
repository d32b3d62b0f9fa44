"""The episodes of one process and the operations on them.

An :class:`EpisodeHost` owns a dict ``instance_id -> episode`` and answers the service's operations
(``create``, ``step``, ``evaluate``, ``info``, ``release``, ``drop``). The same class runs inside each
worker process of :mod:`env_service.pool` and inline in the service process (``workers=0``: tests, the
in-process client, the CPU trainer), so both modes execute exactly the same code.

Every failure leaves :meth:`EpisodeHost.handle` as an :class:`OpError` with a code that the service
maps to an HTTP status and a one-line message; unexpected exceptions are logged here with their
traceback and reach the client only as ``internal``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import ValidationError

logger = logging.getLogger(__name__)

# Error code -> HTTP status. The codes are the public vocabulary of ErrorResponse.error.code.
STATUS_BY_CODE: dict[str, int] = {"bad_request": 400, "not_found": 404, "conflict": 409, "too_large": 413,
                                  "unavailable": 503, "internal": 500}


def one_line(text: object, limit: int = 400) -> str:
    """Collapse ``text`` to a single line of at most ``limit`` characters (error messages only)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class OpError(Exception):
    """A failed operation: ``code`` is a key of :data:`STATUS_BY_CODE`, ``message`` one line."""

    def __init__(self, code: str, message: str) -> None:
        if code not in STATUS_BY_CODE:
            raise ValueError(f"unknown error code {code!r}; known: {sorted(STATUS_BY_CODE)}")
        super().__init__(message)
        self.code = code
        self.message = one_line(message)

    @property
    def status(self) -> int:
        return STATUS_BY_CODE[self.code]

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses the worker pipe by pickle; keep both fields.
        return (OpError, (self.code, self.message))


def validation_summary(err: ValidationError) -> str:
    """``params.foo: Extra inputs are not permitted; ...`` in one line."""
    parts = []
    for item in err.errors()[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ())) or "(body)"
        msg = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        # A validator's own message that already names its key (``params.x.y: ...``) stands alone.
        parts.append(msg if msg.startswith("params.") else f"{loc}: {msg}")
    more = len(err.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class Episode(Protocol):
    """What the host needs from an episode (``env_service.kit.ToolEpisode`` provides it): ``step`` answers
    an object with ``observation``, ``terminated`` and ``info`` (``env_service.kit.StepOutcome``)."""

    def reset(self) -> list[dict]: ...
    def step(self, content: str) -> Any: ...
    def evaluate(self, sparse: bool) -> float | dict: ...
    def info(self) -> Any: ...


EpisodeFactory = Callable[[str, dict], Episode]


def score_of(result: float | dict) -> float:
    """The BFCL accuracy of an ``evaluate`` result: the float itself, or the dict's score field."""
    if isinstance(result, dict):
        for key in ("score", "accuracy"):
            if key in result:
                return float(result[key])
        return 1.0 if result.get("valid") else 0.0
    return float(result)


class EpisodeHost:
    """Live episodes of this process, keyed by instance id."""

    def __init__(self, make_episode: EpisodeFactory) -> None:
        self._make_episode = make_episode
        self._episodes: dict[str, Episode] = {}

    def handle(self, op: str, instance_id: str, payload: dict) -> Any:
        """Run one operation; raises :class:`OpError` only."""
        try:
            handler = _OPS[op]
        except KeyError:
            raise OpError("bad_request", f"unknown operation {op!r}") from None
        try:
            return handler(self, instance_id, payload)
        except OpError:
            raise
        except ValidationError as err:
            raise OpError("bad_request", validation_summary(err)) from None
        except ValueError as err:
            # The release's contract: a ValueError is the caller's mistake (400).
            raise OpError("bad_request", f"{op}: {err}") from None
        except Exception as err:
            logger.exception("operation %s on instance %s failed", op, instance_id)
            raise OpError("internal", f"{op} failed: {type(err).__name__}: {err}") from None

    def _get(self, instance_id: str) -> Episode:
        try:
            return self._episodes[instance_id]
        except KeyError:
            raise OpError("not_found", f"instance {instance_id!r} not found") from None

    def _create(self, instance_id: str, payload: dict) -> dict:
        if instance_id in self._episodes:
            raise OpError("conflict", f"instance {instance_id!r} already exists")
        task_id = payload["task_id"]
        episode = self._make_episode(task_id, payload.get("params") or {})
        messages = episode.reset()
        info = episode.info()
        self._episodes[instance_id] = episode
        base = {"instance_id": instance_id, "task_id": task_id}
        return {"messages": messages, "info": {**base, **info} if isinstance(info, dict) else base}

    def _step(self, instance_id: str, payload: dict) -> tuple[str, bool, float, dict]:
        episode = self._get(instance_id)
        outcome = episode.step(payload["content"])
        # The release scores a finished episode inside /step (sparse accuracy, 0 before the end).
        reward = score_of(episode.evaluate(True)) if outcome.terminated else 0.0
        return outcome.observation, bool(outcome.terminated), float(reward), dict(outcome.info or {})

    def _evaluate(self, instance_id: str, payload: dict) -> float | dict:
        return self._get(instance_id).evaluate(bool(payload.get("sparse", False)))

    def _info(self, instance_id: str, payload: dict) -> Any:
        return self._get(instance_id).info()

    def _release(self, instance_id: str, payload: dict) -> bool:
        return self._episodes.pop(instance_id, None) is not None

    def _drop(self, instance_id: str, payload: dict) -> int:
        """Release several instances at once (the reaper, a dying client); returns how many were live."""
        return sum(self._episodes.pop(i, None) is not None for i in payload["instance_ids"])


_OPS: dict[str, Callable[[EpisodeHost, str, dict], Any]] = {
    op: getattr(EpisodeHost, f"_{op}") for op in ("create", "step", "evaluate", "info", "release", "drop")}


def load_host_factory(path: str) -> Callable[[], EpisodeHost]:
    """Resolve ``"package.module:function"`` to a zero-argument host factory."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"host_factory must look like 'package.module:function', got {path!r}")
    factory = getattr(importlib.import_module(module_name), attr, None)
    if not callable(factory):
        raise ValueError(f"host_factory {path!r}: {attr!r} is not a callable in {module_name!r}")
    return factory
