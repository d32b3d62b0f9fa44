"""The environment service's logic, shared by the HTTP routes and the in-process client.

:class:`EnvService` keeps the registry of live instances (which worker slot owns each, when it was
last used), enforces the instance cap, reaps abandoned instances after a TTL, counts metrics, and
forwards each operation to the owning worker (:mod:`env_service.pool`). It knows nothing about HTTP:
``app.py`` turns its results into envelopes and its :class:`~env_service.host.OpError` into statuses,
and ``client.EnvClient.in_process`` calls it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from env_service import schemas
from env_service.host import EpisodeHost, OpError, score_of
from env_service import catalogue as offline
from env_service.pool import InlineBackend, WorkerPool
from env_service.registry import DEFAULT_ENVIRONMENT, get_environment
from seal_shared.held_out import HELD_OUT_SPLITS, HeldOutSplitError, final_evaluation
from seal_shared.interface.blocks import enabled_blocks, unhonoured_message
from seal_shared.plugins import load_plugins

logger = logging.getLogger(__name__)

_GONE_MEMORY = 20_000  # how many released/reaped/lost ids we remember, for clearer 404/503 messages


@dataclass
class ServiceConfig:
    """Knobs of the service (``python -m env_service --help`` lists the matching flags).

    ``workers``: worker processes; ``None`` means one per CPU, ``0`` runs episodes inline in the
    service process (no watchdog: a call that never returns blocks the service, and the
    executor's per-call timer only works on a process's main thread). ``ttl_s``: an instance idle
    this long is reaped. ``max_instances``: live instances beyond this get 503 on ``/create``.
    ``request_timeout_s``: a worker that takes longer to answer one request is killed (its episodes
    are lost) so nothing ever hangs. ``max_content_chars``: longer assistant messages get 413.
    ``env``: the environment served, a name of :mod:`env_service.registry` (``bfcl`` by default).
    ``host_factory``: builds each process's :class:`EpisodeHost` (a ``"module:function"`` path;
    inline mode also takes the callable itself, e.g. a test double); ``None`` = the environment's.
    ``plugins``: modules imported before ``env`` is looked up (one may register the environment) and
    again first thing in every worker process (``--plugin``; the trainer's ``seal.plugins``).
    """

    workers: int | None = None
    ttl_s: float = 3600.0
    reap_interval_s: float | None = None
    max_instances: int = 1024
    request_timeout_s: float = 60.0
    max_content_chars: int = 1_000_000
    host_factory: str | Callable[[], EpisodeHost] | None = None
    env: str = DEFAULT_ENVIRONMENT
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.plugins = tuple(self.plugins)
        load_plugins(self.plugins)  # before the name is looked up: a plug-in may register the environment
        if self.host_factory is None:
            self.host_factory = get_environment(self.env).host_factory
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = inline), got {self.workers}")
        for name in ("ttl_s", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_instances < 1:
            raise ValueError(f"max_instances must be >= 1, got {self.max_instances}")

    @property
    def resolved_workers(self) -> int:
        return (os.cpu_count() or 1) if self.workers is None else self.workers

    @property
    def resolved_reap_interval_s(self) -> float:
        return self.reap_interval_s if self.reap_interval_s is not None else max(0.05, min(60.0, self.ttl_s / 4))


@dataclass
class _Instance:
    slot: int
    generation: int
    task_id: str
    last_used: float
    inflight: int = 0


@dataclass
class _Counters:
    created: int = 0
    released: int = 0
    reaped: int = 0
    lost: int = 0
    steps: int = 0
    rejected_over_cap: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class LatencyWindow:
    """Per-route request durations over a sliding window (for ``/metrics`` p50/p99)."""

    def __init__(self, size: int = 4096) -> None:
        self._samples: defaultdict[str, deque[float]] = defaultdict(functools.partial(deque, maxlen=size))

    def record(self, route: str, seconds: float) -> None:
        self._samples[route].append(seconds)

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for route, window in sorted(self._samples.items()):
            ordered = sorted(window)
            n = len(ordered)
            out[route] = {"count": n, "p50_ms": 1e3 * ordered[(n - 1) // 2],
                          "p99_ms": 1e3 * ordered[min(n - 1, int(0.99 * n))]}
        return out


def observation_message(content: str, info: dict | None = None) -> dict:
    """The release's observation message: the text and an empty ``tool_calls``, with role ``user``,
    or the role the episode reports in its step ``info`` (``ipython`` in the Llama-3.1 modes)."""
    return {"role": (info or {}).get("observation_role") or "user", "content": content, "tool_calls": []}


def check_instance_id(instance_id: str) -> str:
    if not isinstance(instance_id, str) or not 0 < len(instance_id) <= 200 or not instance_id.isprintable() \
            or any(c.isspace() for c in instance_id):
        raise OpError("bad_request", "instance_id must be 1-200 printable characters without whitespace")
    return instance_id


class EnvService:
    """Registry, cap, reaper and metrics in front of a backend (inline or worker processes)."""

    def __init__(self, config: ServiceConfig | None = None) -> None:
        self.config = config or ServiceConfig()
        workers = self.config.resolved_workers
        if workers == 0:
            self.backend: InlineBackend | WorkerPool = InlineBackend(self.config.host_factory)
        else:
            if not isinstance(self.config.host_factory, str):
                raise ValueError("worker processes need host_factory as a 'module:function' path, not an object")
            self.backend = WorkerPool(workers, self.config.host_factory, on_lost=self._on_worker_lost,
                                      request_timeout_s=self.config.request_timeout_s,
                                      preload=self.config.plugins)
        self._instances: dict[str, _Instance] = {}
        self._per_slot = [0] * self.backend.size
        self._gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (code, message)
        self._counters = _Counters()
        self.latency = LatencyWindow()
        self._reaper: asyncio.Task | None = None
        self._profiles: dict[str, list[str]] = {}
        self._catalogue: schemas.CatalogueResponse | None = None
        self._started_at = time.monotonic()
        self.running = False

    async def start(self) -> None:
        await self.backend.start()
        self._reaper = asyncio.create_task(self._reap_forever(), name="env-reaper")
        self._started_at = time.monotonic()
        self.running = True

    async def stop(self) -> None:
        self.running = False
        if self._reaper is not None:
            self._reaper.cancel()
        await self.backend.stop()

    def _forget(self, instance_id: str, code: str, message: str) -> None:
        inst = self._instances.pop(instance_id, None)
        if inst is not None:
            self._per_slot[inst.slot] -= 1
        self._gone[instance_id] = (code, message)
        while len(self._gone) > _GONE_MEMORY:
            self._gone.popitem(last=False)

    def _lookup(self, instance_id: str) -> _Instance:
        inst = self._instances.get(instance_id)
        if inst is None:
            code, message = self._gone.get(instance_id, ("not_found", f"instance {instance_id!r} not found"))
            raise OpError(code, message)
        return inst

    def _on_worker_lost(self, slot: int, generation: int, reason: str) -> None:
        lost = [i for i, inst in self._instances.items() if inst.slot == slot and inst.generation == generation]
        for instance_id in lost:
            self._forget(instance_id, "unavailable", f"instance {instance_id!r} was lost: {reason}; start a new episode")
        self._counters.lost += len(lost)

    def _pick_slot(self) -> int:
        alive = [s for s in range(self.backend.size) if self.backend.alive(s)]
        if not alive:
            raise OpError("unavailable", "no environment worker is running (restarting); retry shortly")
        return min(alive, key=lambda s: self._per_slot[s])

    async def _call(self, instance_id: str, op: str, payload: dict) -> Any:
        inst = self._lookup(instance_id)
        inst.inflight += 1
        try:
            return await self.backend.call(inst.slot, op, instance_id, payload)
        except OpError as err:
            if err.code == "not_found" and instance_id in self._instances:
                # The worker no longer has it (it was restarted between our lookup and the call).
                self._forget(instance_id, "unavailable", f"instance {instance_id!r} was lost with its worker")
            raise
        finally:
            inst.inflight -= 1
            inst.last_used = time.monotonic()

    async def create(self, task_id: str, params: dict | None = None,
                     instance_id: str | None = None) -> tuple[str, list[dict], dict]:
        """Start an episode; returns ``(instance_id, [system, user], info)``."""
        if not isinstance(task_id, str) or not task_id:
            raise OpError("bad_request", "task_id is required (an id of the served environment's tasks, e.g. "
                                         f"{get_environment(self.config.env).example_task_id!r})")
        if params is not None and not isinstance(params, dict):
            raise OpError("bad_request", "params must be a JSON object")
        if params and schemas.nesting_exceeds(params, schemas.MAX_NESTING - 1):
            # HTTP bodies were checked as they were parsed; this holds the in-process client to the same.
            raise OpError("too_large", f"params nest objects/lists deeper than {schemas.MAX_NESTING - 1} levels "
                                       "(fix: send flat params; no environment needs more)")
        if params:
            self._check_honoured(params)
        instance_id = check_instance_id(instance_id) if instance_id is not None else f"inst_{uuid.uuid4().hex}"
        if instance_id in self._instances:
            raise OpError("conflict", f"instance {instance_id!r} is already live; release it or pick another id")
        if len(self._instances) >= self.config.max_instances:
            self._counters.rejected_over_cap += 1
            raise OpError("unavailable", f"instance cap reached ({self.config.max_instances} live); "
                                         "release finished episodes or retry later")
        slot = self._pick_slot()
        # Reserve before awaiting, so concurrent creates cannot overshoot the cap.
        inst = _Instance(slot, self.backend.generation(slot), task_id, time.monotonic(), inflight=1)
        self._instances[instance_id] = inst
        self._per_slot[slot] += 1
        self._gone.pop(instance_id, None)
        try:
            out = await self.backend.call(slot, "create", instance_id, {"task_id": task_id, "params": params or {}})
        except BaseException:
            if self._instances.get(instance_id) is inst:
                del self._instances[instance_id]
                self._per_slot[slot] -= 1
            raise
        finally:
            inst.inflight -= 1
        self._counters.created += 1
        return instance_id, out["messages"], out["info"]

    def _check_honoured(self, params: dict) -> None:
        """An interface block turned on that the served environment does not honour is refused (400),
        not silently ignored (:mod:`seal_shared.interface.blocks`)."""
        env = get_environment(self.config.env)
        for block in enabled_blocks(params):
            if block not in env.interface_blocks:
                raise OpError("bad_request", unhonoured_message(block, env.name, env.interface_blocks, "params"))

    async def step(self, instance_id: str, content: str) -> tuple[str, bool, float, dict]:
        """One assistant message; returns ``(observation, terminated, reward, info)``."""
        if not isinstance(content, str):
            raise OpError("bad_request", "the assistant content must be a string")
        if len(content) > self.config.max_content_chars:
            raise OpError("too_large", f"assistant content has {len(content)} characters; "
                                       f"the limit is {self.config.max_content_chars}")
        out = await self._call(instance_id, "step", {"content": content})
        self._counters.steps += 1
        return out

    async def evaluate(self, instance_id: str, sparse: bool = False) -> float | dict:
        return await self._call(instance_id, "evaluate", {"sparse": bool(sparse)})

    async def get_info(self, instance_id: str) -> Any:
        return await self._call(instance_id, "info", {})

    async def release(self, instance_id: str) -> bool:
        """Forget an instance; ``False`` if it was not live (unknown, released, reaped or lost)."""
        inst = self._instances.get(instance_id)
        if inst is None:
            return False
        self._forget(instance_id, "not_found", f"instance {instance_id!r} was released")
        self._counters.released += 1
        if not self.backend.alive(inst.slot) or self.backend.generation(inst.slot) != inst.generation:
            return True
        try:
            await self.backend.call(inst.slot, "release", instance_id, {})
        except OpError as err:
            if err.code != "unavailable":
                raise
            # Its worker died meanwhile: the episode is gone either way.
        return True

    async def env_profile(self, split: str = "train", *, final_reason: str | None = None) -> list[str]:
        """Task ids of a split (``train``/``val``/``test``/``eval``), as the served environment defines them.

        A held-out split (``test``, ``eval``) is answered only inside a final evaluation: one open in
        this process (an in-process service), or ``final_reason``, which opens one for this read.
        It is never cached, so each read goes through the store's guard and is logged and recorded."""
        if split not in schemas.SPLITS:
            raise OpError("bad_request", f"unknown split {split!r}; known: {', '.join(schemas.SPLITS)}")
        load_split = get_environment(self.config.env).load_split
        if split in HELD_OUT_SPLITS:
            scope = final_evaluation(final_reason) if final_reason else contextlib.nullcontext()
            try:
                with scope:
                    return list(await asyncio.to_thread(load_split, split))
            except HeldOutSplitError as err:
                raise OpError("bad_request", str(err)) from None
        if split not in self._profiles:
            self._profiles[split] = list(await asyncio.to_thread(load_split, split))
        return list(self._profiles[split])

    # The typed (/v1) operations: the /v1 routes and the in-process client both call these, so both give
    # the same answers.
    async def v1_create(self, req: schemas.CreateRequest) -> schemas.CreateResponse:
        instance_id, messages, info = await self.create(req.task_id, req.params, req.instance_id)
        return schemas.CreateResponse(instance_id=instance_id, messages=messages, info=info)

    async def v1_step(self, req: schemas.StepRequest) -> schemas.StepResponse:
        observation, terminated, reward, info = await self.step(req.instance_id, req.content)
        return schemas.StepResponse(observation=observation_message(observation, info), terminated=terminated,
                                    reward=reward, info=info)

    async def v1_evaluate(self, req: schemas.EvaluateRequest) -> schemas.EvaluateResponse:
        result = await self.evaluate(req.instance_id, req.sparse)
        if isinstance(result, dict):
            return schemas.EvaluateResponse(score=score_of(result), result=result)
        return schemas.EvaluateResponse(score=float(result))

    async def v1_release(self, req: schemas.InstanceRequest) -> schemas.ReleaseResponse:
        return schemas.ReleaseResponse(released=await self.release(req.instance_id))

    async def v1_info(self, req: schemas.InstanceRequest) -> schemas.InfoResponse:
        return schemas.InfoResponse(info=await self.get_info(req.instance_id))

    async def v1_profile(self, req: schemas.ProfileRequest) -> schemas.ProfileResponse:
        return schemas.ProfileResponse(split=req.split, task_ids=await self.env_profile(req.split))

    # What a trainer reads of the environment without an episode: computed in this process (the
    # task store is the workers' too), off the event loop.
    async def v1_catalogue(self, req: schemas.CatalogueRequest) -> schemas.CatalogueResponse:
        if self._catalogue is None:
            self._catalogue = schemas.CatalogueResponse(**await asyncio.to_thread(offline.catalogue, self.config.env))
        return self._catalogue

    async def v1_check_params(self, req: schemas.ParamsCheckRequest) -> schemas.ParamsCheckResponse:
        problem = await asyncio.to_thread(offline.params_problem, self.config.env, req.params)
        return schemas.ParamsCheckResponse(problem=problem)

    async def v1_oracle(self, req: schemas.OracleRequest) -> schemas.OracleResponse:
        turns, messages = await asyncio.to_thread(offline.oracle, self.config.env, req.task_id, req.tool_call_parser)
        return schemas.OracleResponse(task_id=req.task_id, gt_turns=turns, messages=messages)

    async def v1_judge(self, req: schemas.JudgeRequest) -> schemas.EvaluateResponse:
        result = await asyncio.to_thread(offline.judge, self.config.env, req.task_id, req.model_turns)
        return schemas.EvaluateResponse(score=score_of(result), result=result)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.resolved_reap_interval_s)
            try:
                await self.reap()
            except OpError as err:
                logger.warning("reaper: %s", err.message)

    async def reap(self, now: float | None = None) -> int:
        """Release every instance idle for more than ``ttl_s`` (none with a request in flight)."""
        now = time.monotonic() if now is None else now
        stale = [(i, inst) for i, inst in self._instances.items()
                 if inst.inflight == 0 and now - inst.last_used > self.config.ttl_s]
        by_slot: dict[int, list[str]] = {}
        for instance_id, inst in stale:
            self._forget(instance_id, "not_found",
                         f"instance {instance_id!r} was reaped after {self.config.ttl_s:g} s without requests")
            if self.backend.alive(inst.slot) and self.backend.generation(inst.slot) == inst.generation:
                by_slot.setdefault(inst.slot, []).append(instance_id)
        self._counters.reaped += len(stale)
        for slot, ids in by_slot.items():
            await self.backend.call(slot, "drop", "", {"instance_ids": ids})
        if stale:
            logger.info("reaped %d idle instances", len(stale))
        return len(stale)

    def count_error(self, code: str) -> None:
        self._counters.errors[code] = self._counters.errors.get(code, 0) + 1

    def workers_alive(self) -> int:
        return sum(self.backend.alive(s) for s in range(self.backend.size))

    def health(self) -> schemas.HealthResponse:
        alive = self.workers_alive()
        return schemas.HealthResponse(status="ok" if alive == self.backend.size else "degraded",
                                      workers=self.backend.size, workers_alive=alive)

    def metrics(self) -> schemas.MetricsResponse:
        c = self._counters
        return schemas.MetricsResponse(
            uptime_s=time.monotonic() - self._started_at, workers=self.backend.size,
            workers_alive=self.workers_alive(), worker_restarts=self.backend.restarts,
            instances_live=len(self._instances), instances_per_worker=list(self._per_slot),
            created_total=c.created, released_total=c.released, reaped_total=c.reaped, lost_total=c.lost,
            steps_total=c.steps, rejected_over_cap_total=c.rejected_over_cap, errors_total=dict(c.errors),
            latency=self.latency.summary())
