"""The one environment client: over HTTP (one or several service URLs) or in-process.

>>> client = EnvClient("http://127.0.0.1:8082")          # or EnvClient.in_process()
>>> episode = client.create("multi_turn_base_0")
>>> out = client.step(episode.instance_id, "<tool_call>{...}</tool_call>")
>>> score = client.evaluate(episode.instance_id, sparse=True)
>>> client.release(episode.instance_id)

Errors: :class:`EnvServiceError` means the request itself is wrong (a 4xx: do not retry it);
:class:`EnvUnavailableError` means the environment failed (connection refused, timeout, 503, other
5xx): the caller may retry the episode once and then count an environment fault.

Retries: only idempotent calls (``healthz``, ``evaluate``, ``get_info``, ``release``,
``get_env_profile``, ``metrics``) are retried on unavailability. ``create`` and ``step`` change
state, so they are re-sent only when the connection could not even be opened (nothing was sent).

Several URLs (replicas): an episode sticks to the replica chosen by a hash of its instance id, so every
call of an episode reaches the process that owns it. ``create`` picks the instance id client-side when
none is given, so the choice is known before the first request.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from env_service import schemas
from env_service.host import OpError, one_line, validation_summary

T = TypeVar("T")


class EnvError(Exception):
    """Base of the client's errors. ``status`` is the HTTP status (0 when there was no answer)."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", url: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.url = url


class EnvServiceError(EnvError):
    """The service rejected the request (4xx): bad body, unknown task or instance id. Do not retry."""


class EnvUnavailableError(EnvError):
    """The environment could not serve the request (no connection, timeout, 503, 5xx). Retry once."""


@dataclass(frozen=True)
class CreateResult:
    instance_id: str
    messages: list[dict]  # [system, user]
    info: dict


@dataclass(frozen=True)
class StepResult:
    observation: str  # the observation message's content
    terminated: bool
    reward: float  # the sparse score when terminated, else 0.0
    info: dict


def _error_for(status: int, code: str, message: str, url: str = "") -> EnvError:
    cls = EnvServiceError if 400 <= status < 500 else EnvUnavailableError
    return cls(message, status=status, code=code, url=url)


# --------------------------------------------------------------------------- transports


class _HttpTransport:
    """POST/GET JSON against one of several base URLs, with retries for idempotent calls."""

    def __init__(self, urls: Sequence[str], timeout_s: float, retries: int, backoff_s: float,
                 max_connections: int) -> None:
        if not urls:
            raise ValueError("EnvClient needs at least one service URL, e.g. 'http://127.0.0.1:8082'")
        self.urls = [u.rstrip("/") for u in urls]
        self.retries = retries
        self.backoff_s = backoff_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.Client(timeout=timeout_s, limits=limits)

    def url_for(self, key: str | None) -> str:
        if key is None or len(self.urls) == 1:
            return self.urls[0]
        return self.urls[zlib.crc32(key.encode()) % len(self.urls)]

    def request(self, method: str, path: str, body: dict | None, *, key: str | None, idempotent: bool) -> Any:
        url = self.url_for(key) + path
        attempt = 0
        while True:
            try:
                return self._once(method, url, body)
            except EnvUnavailableError as err:
                # Non-idempotent calls are re-sent only if nothing reached the service.
                retry = idempotent or err.code == "connect"
                if not retry or attempt >= self.retries:
                    raise
            attempt += 1
            time.sleep(self.backoff_s * 2 ** (attempt - 1))

    def _once(self, method: str, url: str, body: dict | None) -> Any:
        try:
            response = self._http.request(method, url, json=body)
        except httpx.ConnectError as err:
            raise EnvUnavailableError(f"cannot connect to {url}: {err}", code="connect", url=url) from None
        except httpx.TimeoutException as err:
            raise EnvUnavailableError(f"{url} timed out ({type(err).__name__})", code="timeout", url=url) from None
        except httpx.TransportError as err:
            raise EnvUnavailableError(f"{url}: {type(err).__name__}: {err}", code="transport", url=url) from None
        if response.status_code >= 400:
            try:
                payload = response.json()
                code, message = payload["error"]["code"], payload["detail"]
            except (ValueError, KeyError, TypeError):
                code, message = "http", one_line(response.text[:300] or response.reason_phrase)
            raise _error_for(response.status_code, code, f"{response.status_code} from {url}: {message}", url)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def close(self) -> None:
        self._http.close()


class _InProcessTransport:
    """Runs an :class:`EnvService` on a private event loop thread; calls go straight to its methods."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="env-service-loop", daemon=True)
        self._thread.start()
        self.run(service.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
        except OpError as err:
            raise _error_for(err.status, err.code, err.message) from None

    def close(self) -> None:
        if not self._loop.is_closed():
            self.run(self.service.stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


# --------------------------------------------------------------------------- the client


class EnvClient:
    """Client of the BFCL environment service; see the module docstring for errors and retries."""

    def __init__(self, url: str | Sequence[str] | None = None, *, timeout_s: float = 300.0, retries: int = 2,
                 backoff_s: float = 0.5, max_connections: int = 64, _in_process: _InProcessTransport | None = None):
        if _in_process is not None:
            self._local, self._http = _in_process, None
        else:
            if url is None:
                raise ValueError("EnvClient(url) needs a service URL (or use EnvClient.in_process())")
            urls = [url] if isinstance(url, str) else list(url)
            self._local, self._http = None, _HttpTransport(urls, timeout_s, retries, backoff_s, max_connections)

    @classmethod
    def in_process(cls, *, workers: int = 0, **config: Any) -> EnvClient:
        """A client with its own service in this process (no socket). ``config``: ServiceConfig fields.

        ``workers=0`` (default) runs episodes on the service's loop thread; ``workers=N`` starts N
        worker processes exactly as the HTTP service does.
        """
        from env_service.service import EnvService, ServiceConfig

        return cls(_in_process=_InProcessTransport(EnvService(ServiceConfig(workers=workers, **config))))

    @property
    def service(self) -> Any:
        """The in-process :class:`EnvService` (``None`` for an HTTP client)."""
        return self._local.service if self._local is not None else None

    # ------------------------------------------------------------------ plumbing

    def _v1(self, route: str, request: BaseModel, response_model: type[BaseModel], *, key: str | None,
            idempotent: bool) -> Any:
        """One typed call: the same request and response models on both transports."""
        if self._local is not None:
            handler: Callable[[Any], Coroutine[Any, Any, BaseModel]] = getattr(self._local.service, f"v1_{route}")
            return response_model.model_validate(self._local.run(handler(request)).model_dump(mode="json"))
        body = request.model_dump(mode="json", exclude_none=True)
        return response_model.model_validate(
            self._http.request("POST", f"/v1/{route}", body, key=key, idempotent=idempotent))

    @staticmethod
    def _request(model: type[BaseModel], **fields: Any) -> BaseModel:
        try:
            return model(**fields)
        except ValidationError as err:
            raise EnvServiceError(f"invalid request: {validation_summary(err)}", status=400, code="bad_request") from None

    # ------------------------------------------------------------------ API

    def healthz(self) -> bool:
        """True when the service answers and at least one worker is up (never raises)."""
        if self._local is not None:
            return self._local.service.running and self._local.service.workers_alive() > 0
        try:
            return self._http._once("GET", self._http.urls[0] + "/healthz", None) == "OK"
        except EnvError:
            return False

    def create(self, task_id: str, params: dict | None = None, instance_id: str | None = None) -> CreateResult:
        """Start an episode of ``task_id``; ``params`` are the episode params (EpisodeParams keys)."""
        instance_id = instance_id or f"inst_{uuid.uuid4().hex}"
        req = self._request(schemas.CreateRequest, task_id=task_id, params=params or {}, instance_id=instance_id)
        out = self._v1("create", req, schemas.CreateResponse, key=instance_id, idempotent=False)
        return CreateResult(out.instance_id, [m.model_dump(exclude_none=True) for m in out.messages], out.info)

    def step(self, instance_id: str, content: str) -> StepResult:
        """Send one assistant message; returns the observation and whether the episode ended."""
        req = self._request(schemas.StepRequest, instance_id=instance_id, content=content)
        out = self._v1("step", req, schemas.StepResponse, key=instance_id, idempotent=False)
        return StepResult(out.observation.content, out.terminated, out.reward, out.info)

    def evaluate(self, instance_id: str, sparse: bool = False) -> float | dict:
        """BFCL accuracy (``sparse``) or the full result dict with per-turn tags."""
        req = self._request(schemas.EvaluateRequest, instance_id=instance_id, sparse=sparse)
        out = self._v1("evaluate", req, schemas.EvaluateResponse, key=instance_id, idempotent=True)
        return out.score if sparse or out.result is None else out.result

    def get_info(self, instance_id: str) -> Any:
        req = self._request(schemas.InstanceRequest, instance_id=instance_id)
        return self._v1("info", req, schemas.InfoResponse, key=instance_id, idempotent=True).info

    def release(self, instance_id: str) -> bool:
        """Free the instance; False if it was not live (already released, reaped or lost)."""
        req = self._request(schemas.InstanceRequest, instance_id=instance_id)
        return self._v1("release", req, schemas.ReleaseResponse, key=instance_id, idempotent=True).released

    def get_env_profile(self, split: str = "train") -> list[str]:
        """Task ids of ``train`` / ``val`` / ``test`` / ``eval``."""
        req = self._request(schemas.ProfileRequest, split=split)
        return self._v1("profile", req, schemas.ProfileResponse, key=None, idempotent=True).task_ids

    def metrics(self) -> dict:
        if self._local is not None:
            return self._local.service.metrics().model_dump(mode="json")
        return self._http.request("GET", "/metrics", None, key=None, idempotent=True)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
