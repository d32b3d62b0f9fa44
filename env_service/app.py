"""HTTP routes of the environment service (FastAPI). Logic lives in :mod:`env_service.service`.

Release-compatible routes (``/healthz``, ``/create``, ``/step``, ``/evaluate``, ``/get_info``,
``/release``, ``/get_env_profile``) take the release's one request body and answer its envelope, so a
client written for the release works unchanged. Typed routes live under ``/v1/``. ``/metrics`` and
``/docs`` (OpenAPI) complete the set.

Status codes (both families): 400 bad body or params, 404 unknown task id, unknown route or unknown /
released / reaped instance id, 409 instance id already live, 413 content too large, 503 instance cap
reached, worker lost or timed out, 500 anything unexpected. The body is always an ``ErrorResponse``
with a one-line ``detail``; tracebacks go to the service log only. A JSON body nesting deeper than
:data:`env_service.schemas.MAX_NESTING` levels is refused (413) as it is parsed, before validation.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from env_service import schemas
from env_service.host import OpError, one_line
from env_service.service import EnvService, ServiceConfig, observation_message

logger = logging.getLogger(__name__)

_SLASHES = re.compile(r"/{2,}")
_BODY_PARSE_DETAIL = ("the body is not valid JSON (bad syntax or encoding, nesting past the parser's limit, "
                      "or a number with more than 4300 digits)")

# Matched first: the router tries routes in order, and these carry an episode's requests (the typed
# ones, which EnvClient speaks, then the release's). Registration order put them 12th-16th of 20,
# behind the docs routes FastAPI adds first.
_HOT_PATHS = ("/v1/step", "/v1/create", "/v1/evaluate", "/v1/release", "/step", "/create", "/evaluate", "/release")

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.ErrorResponse, "description": "bad body or params"},
    404: {"model": schemas.ErrorResponse, "description": "unknown task or instance id"},
    503: {"model": schemas.ErrorResponse, "description": "instance cap reached, or the episode's worker was lost"},
}


def _typed(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def _envelope(data: Any) -> JSONResponse:
    return JSONResponse({"success": True, "data": data})


def _error(status: int, code: str, message: str) -> JSONResponse:
    body = schemas.ErrorResponse(detail=message, error=schemas.ErrorBody(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status)


class _TooLarge(StarletteHTTPException):
    """A body refused while it is read (past the size limit, chunked ones included) or parsed (nesting past
    :data:`schemas.MAX_NESTING`); FastAPI lets HTTP exceptions through its body parsing, so the error
    handlers answer it as a 413."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class _NestingLimitedRequest(Request):
    """A request whose JSON body is refused when it nests too deeply (checked once, as it is parsed).

    A failure to read the body can be held back (:meth:`hold_body_error`) and is then raised by the
    next :meth:`body` call, so FastAPI's own handler meets exactly the error it would have met.
    """

    _body_error: BaseException | None = None

    def hold_body_error(self, err: BaseException) -> None:
        self._body_error = err

    async def body(self) -> bytes:
        if self._body_error is not None:
            raise self._body_error
        return await super().body()

    async def json(self) -> Any:
        body = await super().json()
        if schemas.nesting_exceeds(body):
            raise _TooLarge(f"the body nests objects/lists deeper than {schemas.MAX_NESTING} levels "
                            "(fix: send flat params; no request of this service needs more)")
        return body


# Bodies validated straight from their JSON bytes by pydantic-core (one pass, no intermediate dict).
# Only models of scalar fields that forbid extra keys qualify: for them JSON-mode and Python-mode
# validation accept the same bodies into the same values (tests/env_service/test_service_machinery.py
# compares both paths), and a valid body cannot nest, so the nesting check has nothing to look at.
# CreateRequest is not here: its free-form params could hold what json.loads refuses (numbers of
# more than 4300 digits) and pydantic-core accepts.
_ONE_PASS_BODIES: tuple[type[BaseModel], ...] = (schemas.StepRequest, schemas.EvaluateRequest, schemas.InstanceRequest)


class _NestingLimitedRoute(APIRoute):
    """Routes that parse their body through :class:`_NestingLimitedRequest`.

    The per-step routes (``/v1/step``, ``/v1/evaluate``, ``/v1/release``, ``/v1/info``: about ten of
    an episode's eleven requests) take a shorter path when the body is JSON and valid: pydantic-core
    validates the bytes in one pass and the endpoint is called, skipping FastAPI's dependency solving
    (query, header and cookie parsing for parameters these routes do not have), its content-type
    parsing and the separate ``json.loads`` pass. Anything else (another content type, an unreadable,
    invalid or oversized body) goes through FastAPI's handler unchanged, so every error answer stays
    exactly what it was. (FastAPI's optional request telemetry, which this service does not configure,
    sees no body for requests on the shorter path.)
    """

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()
        body = self._one_pass_body()
        if body is None:
            async def limited(request: Request) -> Response:
                return await handler(_NestingLimitedRequest(request.scope, request.receive))

            return limited
        name, model = body
        endpoint = self.endpoint

        async def one_pass(request: Request) -> Response:
            limited = _NestingLimitedRequest(request.scope, request.receive)
            if limited.headers.get("content-type") != "application/json":
                return await handler(limited)
            try:
                raw = await limited.body()
            except Exception as err:  # FastAPI's handler meets it again and answers as it always did
                limited.hold_body_error(err)
                return await handler(limited)
            try:
                req = model.model_validate_json(raw)
            except ValidationError:
                return await handler(limited)  # the same bytes again, for FastAPI's own error answer
            return await endpoint(**{name: req})

        return one_pass

    def _one_pass_body(self) -> tuple[str, type[BaseModel]] | None:
        """``(parameter name, model)`` when the route's only input is a body of :data:`_ONE_PASS_BODIES`."""
        d = self.dependant
        if d.path_params or d.query_params or d.header_params or d.cookie_params or d.dependencies \
                or len(d.body_params) != 1 or not inspect.iscoroutinefunction(self.endpoint):
            return None
        model = d.body_params[0].field_info.annotation
        return (d.body_params[0].name, model) if model in _ONE_PASS_BODIES else None


class _LatencyMiddleware:
    """Records each request's duration per route path, refuses oversized bodies, folds ``//`` in paths,
    and answers unexpected errors.

    The size limit holds for every body: a declared ``content-length`` beyond it is refused before
    reading, and a body without one (``transfer-encoding: chunked``) is counted as it arrives.
    Repeated slashes are folded because the release's client posts to ``//get_env_profile``.
    An exception no handler took is answered here with a one-line 500 and not re-raised, so the
    server keeps the connection open for the client's next request (an exception left to Starlette's
    last-resort handler is re-raised to the server, which then closes a kept-alive connection after
    the 500). Pure ASGI (cheaper than ``BaseHTTPMiddleware``).
    """

    def __init__(self, app: Any, service: EnvService) -> None:
        self.app = app
        self.service = service
        # JSON escaping can double a text's size; leave room for the rest of the body.
        self.max_body = 4 * service.config.max_content_chars + 65536

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "//" in scope["path"]:
            scope = {**scope, "path": _SLASHES.sub("/", scope["path"])}
        length = dict(scope.get("headers") or ()).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body:
            self.service.count_error("too_large")
            response = _error(413, "too_large", f"request body of {int(length)} bytes exceeds {self.max_body}")
            await response(scope, receive, send)
            return
        received = 0

        async def counted_receive() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:
                raise _TooLarge(f"request body exceeds {self.max_body} bytes")
            return message

        started = False

        async def tracked_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception as err:
            if started:
                raise  # half an answer is out: only closing the connection can end it
            self.service.count_error("internal")
            logger.error("unhandled error on %s %s", scope.get("method"), scope["path"], exc_info=err)
            await _error(500, "internal", one_line(f"internal error: {type(err).__name__}: {err}"))(scope, receive, send)
        finally:
            self.service.latency.record(scope["path"], time.perf_counter() - t0)


def _require_env(req: schemas.ServiceRequest, served: str) -> None:
    # The release's client names the environment on /create ("bfcl"); one left out means the served one.
    if req.env_type is not None and req.env_type != served:
        raise OpError("bad_request", f"unknown env_type {req.env_type!r}; this service serves {served!r}")


def _require_instance(req: schemas.ServiceRequest) -> str:
    # The release looks an instance up by its id alone, and its client sends env_type "default" on
    # every call but /create: the type is checked where an instance is made, not where one is used.
    if not req.instance_id:
        raise OpError("bad_request", "instance_id is required")
    return req.instance_id


def _assistant_content(messages: dict | list) -> str:
    """The release sends ``messages={"role": "assistant", "content": ...}``; a list's last entry is used."""
    message = messages[-1] if isinstance(messages, list) and messages else messages
    if not isinstance(message, dict) or not isinstance(message.get("content"), str):
        raise OpError("bad_request", 'messages must be {"role": "assistant", "content": "<text>"}')
    return message["content"]


def _add_error_handlers(app: FastAPI, service: EnvService) -> None:
    # No ``Exception`` handler here: Starlette runs one in its outermost middleware and then re-raises
    # to the server, which closes the kept-alive connection; _LatencyMiddleware answers those instead.
    @app.exception_handler(OpError)
    async def _op_error(request: Request, err: OpError) -> JSONResponse:
        service.count_error(err.code)
        return _error(err.status, err.code, err.message)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request: Request, err: RequestValidationError) -> JSONResponse:
        service.count_error("bad_request")
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in err.errors()[:5]]
        return _error(400, "bad_request", one_line("invalid request: " + "; ".join(parts)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 413: "too_large"}.get(err.status_code, "bad_request")
        detail = _BODY_PARSE_DETAIL if err.detail == "There was an error parsing the body" else err.detail
        service.count_error(code)
        return _error(err.status_code, code, one_line(f"{request.method} {request.url.path}: {detail}"))


def _add_compat_routes(app: FastAPI, service: EnvService) -> None:
    @app.get("/healthz", response_class=PlainTextResponse, tags=["release-compatible"])
    async def healthz() -> PlainTextResponse:
        if service.running and service.workers_alive() > 0:
            return PlainTextResponse("OK")
        return PlainTextResponse("UNAVAILABLE", status_code=503)

    @app.post("/get_env_profile", response_model=schemas.Envelope, responses=_ERRORS, tags=["release-compatible"])
    async def get_env_profile(req: schemas.ServiceRequest) -> JSONResponse:
        # The release's clients read every split here (their evaluation reads test): answered, as the
        # release did, but never silently: each held-out read is logged and recorded. /v1 refuses it.
        return _envelope(await service.env_profile(str(req.params.get("split", "train")),
                                                   final_reason="a release-compatible /get_env_profile request"))

    @app.post("/create", response_model=schemas.Envelope, responses=_ERRORS, tags=["release-compatible"])
    async def create(req: schemas.ServiceRequest) -> JSONResponse:
        _require_env(req, service.config.env)
        if not req.task_id:
            raise OpError("bad_request", "task_id is required")
        instance_id, messages, info = await service.create(req.task_id, req.params, req.instance_id)
        return _envelope({"state": messages, "info": {**info, "instance_id": instance_id}})

    @app.post("/step", response_model=schemas.Envelope, responses=_ERRORS, tags=["release-compatible"])
    async def step(req: schemas.ServiceRequest) -> JSONResponse:
        instance_id = _require_instance(req)
        observation, terminated, reward, info = await service.step(instance_id, _assistant_content(req.messages))
        return _envelope({"state": [observation_message(observation, info)], "reward": reward,
                          "is_terminated": terminated, "info": info})

    @app.post("/evaluate", response_model=schemas.Envelope, responses=_ERRORS, tags=["release-compatible"])
    async def evaluate(req: schemas.ServiceRequest) -> JSONResponse:
        return _envelope(await service.evaluate(_require_instance(req), bool(req.params.get("sparse", False))))

    @app.post("/get_info", response_model=schemas.Envelope, responses=_ERRORS, tags=["release-compatible"])
    async def get_info(req: schemas.ServiceRequest) -> JSONResponse:
        return _envelope(await service.get_info(_require_instance(req)))

    @app.post("/release", response_model=schemas.Envelope, responses=_ERRORS, tags=["release-compatible"])
    async def release(req: schemas.ServiceRequest) -> JSONResponse:
        return JSONResponse({"success": await service.release(_require_instance(req)), "data": None})


# The typed POST routes: /v1/<name> takes the request model and answers the service's v1_<name>.
_V1_POSTS: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "create": (schemas.CreateRequest, schemas.CreateResponse),
    "step": (schemas.StepRequest, schemas.StepResponse),
    "evaluate": (schemas.EvaluateRequest, schemas.EvaluateResponse),
    "release": (schemas.InstanceRequest, schemas.ReleaseResponse),
    "info": (schemas.InstanceRequest, schemas.InfoResponse),
    "profile": (schemas.ProfileRequest, schemas.ProfileResponse),
    "catalogue": (schemas.CatalogueRequest, schemas.CatalogueResponse),
    "check_params": (schemas.ParamsCheckRequest, schemas.ParamsCheckResponse),
    "oracle": (schemas.OracleRequest, schemas.OracleResponse),
    "judge": (schemas.JudgeRequest, schemas.EvaluateResponse),
}


def _v1_endpoint(service: EnvService, name: str, request: type[BaseModel]) -> Callable[..., Any]:
    async def endpoint(req: Any) -> Response:
        return _typed(await getattr(service, f"v1_{name}")(req))  # looked up per request, as a method call is

    endpoint.__annotations__ = {"req": request, "return": Response}  # FastAPI reads the body model here
    return endpoint


def _add_v1_routes(app: FastAPI, service: EnvService) -> None:
    kw: dict[str, Any] = {"responses": _ERRORS, "tags": ["v1"]}

    @app.get("/v1/healthz", response_model=schemas.HealthResponse, **kw)
    async def v1_healthz() -> Response:
        return _typed(service.health())

    for name, (request, response) in _V1_POSTS.items():
        app.post(f"/v1/{name}", response_model=response, name=f"v1_{name}", **kw)(_v1_endpoint(service, name, request))

    @app.get("/v1/metrics", response_model=schemas.MetricsResponse, tags=["v1"])
    @app.get("/metrics", response_model=schemas.MetricsResponse, tags=["metrics"])
    async def metrics() -> Response:
        return _typed(service.metrics())


def create_app(config: ServiceConfig | None = None, service: EnvService | None = None) -> FastAPI:
    """The FastAPI application; starts and stops the service (and its workers) with the app."""
    service = service or EnvService(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    env = service.config.env
    app = FastAPI(title=f"SEAL environment service ({env})", version=schemas.PROTOCOL_VERSION, lifespan=lifespan,
                  description=f"Multi-turn episodes of the {env!r} environment over HTTP: release-compatible "
                              "routes plus typed /v1 routes.")
    app.state.service = service
    app.router.route_class = _NestingLimitedRoute
    _add_error_handlers(app, service)
    _add_compat_routes(app, service)
    _add_v1_routes(app, service)
    app.add_middleware(_LatencyMiddleware, service=service)
    app.openapi()  # the document is built (and cached) in registration order, before the reordering
    hot = {path: k for k, path in enumerate(_HOT_PATHS)}
    app.router.routes.sort(key=lambda route: hot.get(getattr(route, "path", ""), len(hot)))  # stable
    return app
