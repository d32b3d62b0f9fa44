"""The one environment client: over HTTP (one or several service URLs) or in-process.

>>> client = EnvClient("http://127.0.0.1:8082")          # or EnvClient.in_process(env="bfcl")
>>> episode = client.create("multi_turn_base_0")
>>> out = client.step(episode.instance_id, "<tool_call>{...}</tool_call>")
>>> score = client.evaluate(episode.instance_id, sparse=True)
>>> client.release(episode.instance_id)

Errors: :class:`EnvServiceError` means the request itself is wrong (a 4xx: do not retry it);
:class:`EnvUnavailableError` means the environment failed (connection refused, timeout, 503, other
5xx): the caller may retry the episode once and then count an environment fault.

The episode calls have awaitable twins (``acreate``, ``astep``, ``aevaluate``, ``arelease``) for
asyncio callers such as an agent loop; each runs the same request.

Retries: only idempotent calls (``evaluate``, ``get_info``, ``release``, ``get_env_profile``,
``metrics``) are retried on unavailability (``healthz`` is a probe: one try, never raises). ``create`` and ``step``
change state, so they are re-sent only when the connection could not even be opened (nothing was sent).

Several URLs (replicas): an episode sticks to the replica chosen by a hash of its instance id, so every
call of an episode reaches the process that owns it. ``create`` picks the instance id client-side when
none is given, so the choice is known before the first request.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from env_service import schemas
from env_service.host import OpError, one_line, validation_summary
from seal_shared import DEFAULT_TIMEOUT_S  # per request; also the config's env_service.timeout_s default
from seal_shared.held_out import HELD_OUT_SPLITS, refuse_outside_final_evaluation

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


class _HttpTransport:
    """JSON over HTTP against one of several base URLs; retries for idempotent calls.

    Connections are split over several ``httpx`` clients (one shard per 2 of ``max_connections``,
    chosen by the instance id like the URL): one httpx pool serving dozens of concurrent requests spends
    several times more CPU per request than a few small pools (measured: ~3 ms vs ~1 ms per request
    at 32 concurrent episodes). Async calls use ``httpx.AsyncClient`` shards created on first use
    (bound to the event loop that first used them; :meth:`aclose` releases them).
    """

    _SHARD_CONNECTIONS = 2

    def __init__(self, urls: Sequence[str], timeout_s: float, retries: int, backoff_s: float,
                 max_connections: int) -> None:
        if not urls:
            raise ValueError("EnvClient needs at least one service URL, e.g. 'http://127.0.0.1:8082'")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.urls = [u.rstrip("/") for u in urls]
        self.retries = retries
        self.backoff_s = backoff_s
        self._shards = -(-max_connections // self._SHARD_CONNECTIONS)
        # Each shard may open up to max_connections so that an unlucky hash split never makes requests
        # wait for a connection; in practice a shard holds about max_connections / shards of them.
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # The SSL context is built once: httpx would load the CA file per client.
        self._client_options = {"timeout": timeout_s, "limits": limits, "verify": ssl.create_default_context()}
        self._http: dict[int, httpx.Client] = {}
        self._ahttp: dict[int, httpx.AsyncClient] = {}

    def _sync_client(self, shard: int) -> httpx.Client:
        if shard not in self._http:
            self._http[shard] = httpx.Client(**self._client_options)
        return self._http[shard]

    def _async_client(self, shard: int) -> httpx.AsyncClient:
        if shard not in self._ahttp:
            self._ahttp[shard] = httpx.AsyncClient(**self._client_options)
        return self._ahttp[shard]

    def _hash(self, key: str | None) -> int:
        return 0 if key is None else zlib.crc32(key.encode())

    def url_for(self, key: str | None) -> str:
        return self.urls[self._hash(key) % len(self.urls)]

    def _shard(self, key: str | None) -> int:
        return (self._hash(key) // len(self.urls)) % self._shards

    def _retry_delay(self, err: EnvUnavailableError, idempotent: bool, attempt: int) -> float:
        """Seconds to wait before re-sending after failed try ``attempt`` (from 0); re-raises ``err`` when
        the call must not be re-sent: non-idempotent calls are re-sent only if nothing reached the service."""
        if not ((idempotent or err.code == "connect") and attempt < self.retries):
            raise err
        return self.backoff_s * 2 ** attempt

    def request(self, method: str, path: str, body: dict | None, *, key: str | None, idempotent: bool) -> Any:
        url, shard = self.url_for(key) + path, self._shard(key)
        for attempt in itertools.count():
            try:
                return self._once(method, url, body, shard)
            except EnvUnavailableError as err:
                time.sleep(self._retry_delay(err, idempotent, attempt))

    async def arequest(self, method: str, path: str, body: dict | None, *, key: str | None, idempotent: bool) -> Any:
        url, shard = self.url_for(key) + path, self._shard(key)
        for attempt in itertools.count():
            try:
                return await self._aonce(method, url, body, shard)
            except EnvUnavailableError as err:
                await asyncio.sleep(self._retry_delay(err, idempotent, attempt))

    def _once(self, method: str, url: str, body: dict | None, shard: int = 0) -> Any:
        try:
            response = self._sync_client(shard).request(method, url, json=body)
        except httpx.TransportError as err:
            raise _transport_error(err, url) from None
        return _decode(response, url)

    async def _aonce(self, method: str, url: str, body: dict | None, shard: int = 0) -> Any:
        try:
            response = await self._async_client(shard).request(method, url, json=body)
        except httpx.TransportError as err:
            raise _transport_error(err, url) from None
        return _decode(response, url)

    def close(self) -> None:
        for http in self._http.values():
            http.close()
        self._http.clear()

    async def aclose(self) -> None:
        for http in self._ahttp.values():
            await http.aclose()
        self._ahttp.clear()


def _transport_error(err: httpx.TransportError, url: str) -> EnvUnavailableError:
    if isinstance(err, httpx.ConnectError):
        return EnvUnavailableError(f"cannot connect to {url}: {err}", code="connect", url=url)
    if isinstance(err, httpx.TimeoutException):
        return EnvUnavailableError(f"{url} timed out ({type(err).__name__})", code="timeout", url=url)
    return EnvUnavailableError(f"{url}: {type(err).__name__}: {err}", code="transport", url=url)


def _decode(response: httpx.Response, url: str) -> Any:
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


def known_environments() -> list[str]:
    """The environment names a service of this process could serve (built in, or registered by an
    imported plug-in)."""
    from env_service.registry import known_environments as names

    return names()


def registry_changes() -> int:
    """A count that changes whenever an environment is registered or removed in this process: key
    a cache of an in-process service's answers by it."""
    from env_service.registry import registry_changes as changes

    return changes()


@dataclass(frozen=True)
class EnvCatalogue:
    """An environment's catalogue (``/v1/catalogue``): what a trainer reads of it without an episode."""

    name: str
    description: str
    example_task_id: str
    interface_blocks: tuple[str, ...]
    splits: Mapping[str, list[str]]
    categories: Mapping[str, str]
    tool_parameters: Mapping[str, list[str]]

    @classmethod
    def from_wire(cls, out: schemas.CatalogueResponse) -> EnvCatalogue:
        return cls(out.env, out.description, out.example_task_id, tuple(out.interface_blocks), out.splits,
                   out.categories, out.tool_parameters)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.categories

    def ids(self) -> list[str]:
        return list(self.categories)

    def load_split(self, split: str) -> list[str]:
        """The ids of ``train``, ``val``, ``test`` or ``eval`` (val and test), as the environment splits them.

        The catalogue lists ``train`` and ``val`` only. A held-out split (``test``, ``eval``) is read
        inside a final evaluation alone (``HeldOutSplitError`` elsewhere), from the environment's
        registration in this process, whose task store logs and records the read."""
        if split in HELD_OUT_SPLITS and split not in self.splits:
            refuse_outside_final_evaluation(self.name, split)
            from env_service.registry import get_environment

            return list(get_environment(self.name).load_split(split))
        if split not in self.splits:
            known = [*self.splits, *(s for s in HELD_OUT_SPLITS if s not in self.splits)]
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(known)}")
        return list(self.splits[split])

    def categories_of(self, task_ids: Sequence[str]) -> dict[str, str]:
        """``task_id -> category``; ``KeyError`` naming the first unknown id."""
        out = {}
        for tid in task_ids:
            if tid not in self.categories:
                raise KeyError(f"unknown {self.name} task id {tid!r} (ids look like {self.example_task_id!r})")
            out[tid] = self.categories[tid]
        return out


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

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))
        except OpError as err:
            raise _error_for(err.status, err.code, err.message) from None

    def close(self) -> None:
        if not self._loop.is_closed():
            self.run(self.service.stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


@dataclass(frozen=True)
class _Call:
    """One typed call, transport-independent: the route, its request and how to read the answer."""

    route: str
    request: BaseModel
    response_model: type[BaseModel]
    key: str | None
    idempotent: bool
    convert: Callable[[Any], Any]


class EnvClient:
    """Client of the environment service; see the module docstring for errors and retries."""

    def __init__(self, url: str | Sequence[str] | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 2,
                 backoff_s: float = 0.5, max_connections: int = 64, _in_process: _InProcessTransport | None = None):
        if _in_process is not None:
            self._local, self._http = _in_process, None
        else:
            if url is None:
                raise ValueError("EnvClient(url) needs a service URL (or use EnvClient.in_process())")
            urls = [url] if isinstance(url, str) else list(url)
            self._local, self._http = None, _HttpTransport(urls, timeout_s, retries, backoff_s, max_connections)

    @classmethod
    def in_process(cls, *, env: str | None = None, workers: int = 0, **config: Any) -> EnvClient:
        """A client with its own service in this process (no socket). ``config``: ServiceConfig fields.

        ``env`` names the environment served (:mod:`env_service.registry`; ``None``: ``bfcl``).

        ``workers=0`` (default) runs episodes on the service's loop thread: no processes to start,
        but no watchdog either (a tool call that never returns would block the client; the
        executor's per-call timer needs a main thread). ``workers=N`` starts N worker processes
        exactly as the HTTP service does, with its request timeout: the safer choice for a long
        training run on untrusted model output.
        """
        from env_service.service import EnvService, ServiceConfig

        if env is not None:
            config["env"] = env
        return cls(_in_process=_InProcessTransport(EnvService(ServiceConfig(workers=workers, **config))))

    @property
    def service(self) -> Any:
        """The in-process :class:`EnvService` (``None`` for an HTTP client)."""
        return self._local.service if self._local is not None else None

    def _call(self, call: _Call) -> Any:
        if self._local is not None:
            handler = getattr(self._local.service, f"v1_{call.route}")
            raw = self._local.run(handler(call.request)).model_dump(mode="json")
        else:
            raw = self._http.request("POST", f"/v1/{call.route}", call.request.model_dump(mode="json", exclude_none=True),
                                     key=call.key, idempotent=call.idempotent)
        return call.convert(call.response_model.model_validate(raw))

    async def _acall(self, call: _Call) -> Any:
        if self._local is not None:
            handler = getattr(self._local.service, f"v1_{call.route}")
            raw = (await self._local.arun(handler(call.request))).model_dump(mode="json")
        else:
            raw = await self._http.arequest("POST", f"/v1/{call.route}",
                                            call.request.model_dump(mode="json", exclude_none=True),
                                            key=call.key, idempotent=call.idempotent)
        return call.convert(call.response_model.model_validate(raw))

    @staticmethod
    def _request(model: type[BaseModel], **fields: Any) -> BaseModel:
        try:
            return model(**fields)
        except ValidationError as err:
            raise EnvServiceError(f"invalid request: {validation_summary(err)}", status=400, code="bad_request") from None

    def _create_call(self, task_id: str, params: dict | None, instance_id: str | None) -> _Call:
        instance_id = instance_id or f"inst_{uuid.uuid4().hex}"
        req = self._request(schemas.CreateRequest, task_id=task_id, params=params or {}, instance_id=instance_id)
        return _Call("create", req, schemas.CreateResponse, instance_id, False, lambda out: CreateResult(
            out.instance_id, [m.model_dump(exclude_none=True) for m in out.messages], out.info))

    def _step_call(self, instance_id: str, content: str) -> _Call:
        req = self._request(schemas.StepRequest, instance_id=instance_id, content=content)
        return _Call("step", req, schemas.StepResponse, instance_id, False, lambda out: StepResult(
            out.observation.content, out.terminated, out.reward, out.info))

    def _evaluate_call(self, instance_id: str, sparse: bool) -> _Call:
        req = self._request(schemas.EvaluateRequest, instance_id=instance_id, sparse=sparse)
        return _Call("evaluate", req, schemas.EvaluateResponse, instance_id, True,
                     lambda out: out.score if sparse or out.result is None else out.result)

    def _info_call(self, instance_id: str) -> _Call:
        req = self._request(schemas.InstanceRequest, instance_id=instance_id)
        return _Call("info", req, schemas.InfoResponse, instance_id, True, lambda out: out.info)

    def _release_call(self, instance_id: str) -> _Call:
        req = self._request(schemas.InstanceRequest, instance_id=instance_id)
        return _Call("release", req, schemas.ReleaseResponse, instance_id, True, lambda out: out.released)

    def _profile_call(self, split: str) -> _Call:
        req = self._request(schemas.ProfileRequest, split=split)
        return _Call("profile", req, schemas.ProfileResponse, None, True, lambda out: out.task_ids)

    def catalogue(self) -> EnvCatalogue:
        """The served environment's catalogue: splits, task categories, interface blocks, tool parameters."""
        req = self._request(schemas.CatalogueRequest)
        return self._call(_Call("catalogue", req, schemas.CatalogueResponse, None, True, EnvCatalogue.from_wire))

    def check_params(self, params: dict[str, Any]) -> str | None:
        """Why the environment refuses this episode-params block, in one line; ``None`` when it accepts it."""
        req = self._request(schemas.ParamsCheckRequest, params=params)
        return self._call(_Call("check_params", req, schemas.ParamsCheckResponse, None, True, lambda out: out.problem))

    def oracle(self, task_id: str, tool_call_parser: str = "xml_json") -> tuple[list[list[str]], list[str]]:
        """A task's ground-truth calls per turn and the assistant messages that play them."""
        req = self._request(schemas.OracleRequest, task_id=task_id, tool_call_parser=tool_call_parser)
        return self._call(_Call("oracle", req, schemas.OracleResponse, None, True,
                                lambda out: (out.gt_turns, out.messages)))

    def judge(self, task_id: str, model_turns: list[list[list[str]]]) -> dict:
        """The environment's evaluation of these calls (turn -> step -> call strings), without an episode."""
        req = self._request(schemas.JudgeRequest, task_id=task_id, model_turns=model_turns)
        return self._call(_Call("judge", req, schemas.EvaluateResponse, None, True, lambda out: out.result))

    def healthz(self) -> bool:
        """True when the service answers and at least one worker is up (never raises, never retries)."""
        if self._local is not None:
            return self._local.service.running and self._local.service.workers_alive() > 0
        try:
            return self._http._once("GET", self._http.urls[0] + "/healthz", None) == "OK"
        except EnvError:
            return False

    def create(self, task_id: str, params: dict | None = None, instance_id: str | None = None) -> CreateResult:
        """Start an episode of ``task_id``; ``params`` are the episode params (EpisodeParams keys)."""
        return self._call(self._create_call(task_id, params, instance_id))

    def step(self, instance_id: str, content: str) -> StepResult:
        """Send one assistant message; returns the observation and whether the episode ended."""
        return self._call(self._step_call(instance_id, content))

    def evaluate(self, instance_id: str, sparse: bool = False) -> float | dict:
        """BFCL accuracy (``sparse``) or the full result dict with per-turn tags."""
        return self._call(self._evaluate_call(instance_id, sparse))

    def get_info(self, instance_id: str) -> Any:
        """Where the episode stands (turn, offered tools, event counts)."""
        return self._call(self._info_call(instance_id))

    def release(self, instance_id: str) -> bool:
        """Free the instance; False if it was not live (already released, reaped or lost)."""
        return self._call(self._release_call(instance_id))

    def get_env_profile(self, split: str = "train") -> list[str]:
        """Task ids of ``train`` / ``val`` / ``test`` / ``eval``."""
        return self._call(self._profile_call(split))

    def metrics(self) -> dict:
        if self._local is not None:
            return self._local.service.metrics().model_dump(mode="json")
        return self._http.request("GET", "/metrics", None, key=None, idempotent=True)

    async def acreate(self, task_id: str, params: dict | None = None, instance_id: str | None = None) -> CreateResult:
        return await self._acall(self._create_call(task_id, params, instance_id))

    async def astep(self, instance_id: str, content: str) -> StepResult:
        return await self._acall(self._step_call(instance_id, content))

    async def aevaluate(self, instance_id: str, sparse: bool = False) -> float | dict:
        return await self._acall(self._evaluate_call(instance_id, sparse))

    async def arelease(self, instance_id: str) -> bool:
        return await self._acall(self._release_call(instance_id))

    def close(self) -> None:
        """Close connections (and stop the in-process service). Call :meth:`aclose` first if async was used."""
        if self._local is not None:
            self._local.close()
        if self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
